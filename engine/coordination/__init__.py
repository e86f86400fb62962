"""Coordination of a broker set on etcd: the election state's layout and the client that reaches it."""
