"""8x MI355X, single node TP8.

Selection and knobs: group_vars/all.yml, then group_vars/mi355x.yml (the group pyinfra names after
this file), then group_vars/head.yml / workers.yml. Replace the addresses with your nodes'.
"""

head = [("mi355x-node1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]
