"""Model runtime: HF checkpoint loading, the paged-KV decoder, tokenizer, and the demo model.

config.py (config.json -> ModelConfig), loader.py (safetensors -> fused weights), linear.py,
decoder.py (ragged forward over the paged KV cache), inputs.py (ScheduledBatch -> tensors),
kv_memory.py (KV budget and allocation), tokenizer.py + chat_template.py, demo.py.
"""
