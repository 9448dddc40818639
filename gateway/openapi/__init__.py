"""The OpenAPI 3.1 document at /openapi.json: ``operations`` lists every route once,
``models`` the answers' schemas, ``document`` builds it.
"""
