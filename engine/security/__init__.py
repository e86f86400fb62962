"""Who may do what (``acl.py``), checked where a request enters: the front and the gRPC endpoint."""
