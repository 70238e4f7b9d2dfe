"""GB200 NVL72 compute trays (4 GPUs each; multi-node NVLink through IMEX), multi_node_tp over 4 trays (TP16: the
recipe's 16-GPU floor).

Selection and knobs: group_vars/all.yml, then group_vars/gb200.yml (the group pyinfra names after
this file), then group_vars/head.yml / workers.yml. Replace the addresses with your nodes'.
"""

head = [("gb200-node1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]
workers = [
    ("gb200-node2", {"ssh_hostname": "192.0.2.12", "k3_ip": "192.0.2.12", "rank": 1}),
    ("gb200-node3", {"ssh_hostname": "192.0.2.13", "k3_ip": "192.0.2.13", "rank": 2}),
    ("gb200-node4", {"ssh_hostname": "192.0.2.14", "k3_ip": "192.0.2.14", "rank": 3}),
]
