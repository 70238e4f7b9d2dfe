"""8x B300, single node TP8 (the recipe's default landing).

Selection and knobs: group_vars/all.yml, then group_vars/b300.yml (the group pyinfra names after
this file), then group_vars/head.yml / workers.yml. Replace the addresses with your nodes'.
"""

head = [("b300-node1", {"ssh_hostname": "192.0.2.11", "k3_ip": "192.0.2.11"})]
