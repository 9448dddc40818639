"""Both ends of the wire between the gateway and the engines it does not run in its process:
the worker protocol's messages (``messages.py``), the gateway's client of one worker
(``client.py``) over its channel (``channel.py``), and the block keys KV events name
(``keys.py``). Torch-free: the gateway imports it on the slim install."""
