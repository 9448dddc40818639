"""The engines in worker processes, as policy: placement, routing, the KV index, membership, the
local engine launcher, and ``ClusterEngine`` (the wire to a worker is engine/remote/).
"""
