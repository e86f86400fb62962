"""The store's files: the CommitLog, ConsumeQueues, IndexFiles, the checkpoint, the config files.

Each module draws its on-disk layout beside the ``struct`` that reads and writes it.
Nothing here imports zmq or an actor: these are objects over files, used by the
actors, the services and the offline tools alike.
"""
