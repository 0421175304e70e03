"""The ground floor: generic helpers (ports, host memory, files, metrics, days, errors, the
TensorFlow environment) every other package may import; it imports none of them."""
