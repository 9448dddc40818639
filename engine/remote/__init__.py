"""Both ends of the wire between the gateway and the engines it does not run in its process:
kvgate's workers (the protocol's messages, ``messages.py``; the gateway's client of one worker,
``client.py``, over its channel, ``channel.py``; the block keys KV events name, ``keys.py``) and
vLLM servers (their KV events decoded and followed: ``kv_events.py``, ``kv_sequence.py``,
``kv_subscriber.py``). Torch-free: the gateway imports it on the slim install."""
