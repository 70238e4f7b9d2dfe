"""GB300 NVL72 compute trays (4 GPUs each; multi-node NVLink through IMEX), multi_node_tp over 2 trays (TP8).

Selection and knobs: group_vars/all.yml, then group_vars/gb300.yml (the group pyinfra names after
this file), then group_vars/head.yml / workers.yml. Replace the addresses with your nodes'.
"""

head = [("gb300-node1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]
workers = [
    ("gb300-node2", {"ssh_hostname": "192.0.2.12", "k3_ip": "192.0.2.12", "rank": 1}),
]
