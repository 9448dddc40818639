"""What ``kvgate <command>`` runs (gateway/cli.py dispatches): ``serve`` (the gateway, with
the embedded default: ``default_model``), ``worker`` (an engine worker), ``usage`` (the ledger's
reports and retention).
"""
