"""Who is calling: API keys and admin principals to tenants (``auth``), end-user session tokens
(``session_tokens``), the visitor behind a request (``visitor``), and the read-through tables that
keep answering while the database is out (``lkg``, ``misses``).
"""
