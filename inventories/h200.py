"""8x H200 nodes, multi_node_tp_dp over 2 nodes (TP8 x DP2).

Selection and knobs: group_vars/all.yml, then group_vars/h200.yml (the group pyinfra names after
this file), then group_vars/head.yml / workers.yml. Replace the addresses with your nodes'.
"""

head = [("h200-node1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]
workers = [
    ("h200-node2", {"ssh_hostname": "192.0.2.12", "k3_ip": "192.0.2.12", "rank": 1}),
]
