"""8x H100 nodes, multi_node_tp over 4 nodes (TP32).

Selection and knobs: group_vars/all.yml, then group_vars/h100.yml (the group pyinfra names after
this file), then group_vars/head.yml / workers.yml. Replace the addresses with your nodes'.
"""

head = [("h100-node1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]
workers = [
    ("h100-node2", {"ssh_hostname": "192.0.2.12", "k3_ip": "192.0.2.12", "rank": 1}),
    ("h100-node3", {"ssh_hostname": "192.0.2.13", "k3_ip": "192.0.2.13", "rank": 2}),
    ("h100-node4", {"ssh_hostname": "192.0.2.14", "k3_ip": "192.0.2.14", "rank": 3}),
]
