"""Reading attention, and beyond softmax (chapters 19-20): circuits, and the
weights that replace softmax."""
