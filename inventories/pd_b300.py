"""B300 prefill/decode disaggregation: 1 prefill node (TEP8), 2 decode nodes (DEP16), a vllm-router.

Selection: group_vars/pd_b300.yml. The router may share a host with a prefill node.
"""

prefill = [("pd-prefill1", {"ssh_hostname": "192.0.2.21", "k3_ip": "192.0.2.21", "rank": 0})]
decode = [
    ("pd-decode1", {"ssh_hostname": "192.0.2.31", "k3_ip": "192.0.2.31", "rank": 0}),
    ("pd-decode2", {"ssh_hostname": "192.0.2.32", "k3_ip": "192.0.2.32", "rank": 1}),
]
router = [("pd-prefill1", {"ssh_hostname": "192.0.2.21", "k3_ip": "192.0.2.21"})]
