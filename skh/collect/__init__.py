"""Collectors: turn real command output and kernel state into the plain data localization takes.

- :mod:`skh.collect.ovs`: ``ovs-ofctl dump-flows``/``show`` and ``ovs-appctl dpctl/dump-flows``/
  ``dpctl/show`` → flow rules; OpenFlow vs datapath tables of a bridge for the RNIC check
- :mod:`skh.collect.tc`: ``tc filter show`` → the kernel's offload view (``in_hw``/``not_in_hw``)
- :mod:`skh.collect.linux`: ``bridge fdb show``, ``ip route``, ``ip neigh``, ``ip -d link`` (text or
  ``-j``), a pyroute2 reader of a namespace's overlay state, and the overlay forwarding graph
- :mod:`skh.collect.traceroute`: ``traceroute -n`` output and trace results → underlay traces
- :mod:`skh.collect.trace`: a flow-pinned (Paris-style) UDP traceroute, no raw sockets

Parsers never raise on odd or truncated output: what they cannot read they skip.
"""
