"""The OpenAI-compatible chat API: schemas, prompt assembly, SSE framing and the views."""
