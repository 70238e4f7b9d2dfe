"""Ascend 910C (A3, 16 NPUs per node), multi_node_tp_dp over 4 nodes (TP16 x DP4).

Selection and knobs: group_vars/all.yml, then group_vars/ascend910c.yml (the group pyinfra names after
this file), then group_vars/head.yml / workers.yml. Replace the addresses with your nodes'.
"""

head = [("ascend910c-node1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]
workers = [
    ("ascend910c-node2", {"ssh_hostname": "192.0.2.12", "k3_ip": "192.0.2.12", "rank": 1}),
    ("ascend910c-node3", {"ssh_hostname": "192.0.2.13", "k3_ip": "192.0.2.13", "rank": 2}),
    ("ascend910c-node4", {"ssh_hostname": "192.0.2.14", "k3_ip": "192.0.2.14", "rank": 3}),
]
