"""How a training runs beyond one process: parameter servers (ps) and Horovod ring-allreduce (hvd*)."""
