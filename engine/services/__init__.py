"""Services over the store's files: pull, recovery, queue queries, retention, key lookups, long polls.

They decide; the actors call them and carry the answers over sockets.
"""
