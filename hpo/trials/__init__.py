"""One trial: the sweep's validated config, the Ray trainables that train it (``trainable``) or
replay a banked curve (``replay``), and the curve bank's file."""
