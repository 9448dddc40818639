"""OpenAI's Responses and Conversations APIs on the chat path, with stored conversations."""
