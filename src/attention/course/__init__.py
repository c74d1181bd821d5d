"""What the chapters share: notebook set-up and checks, figures, diagrams and the
running example."""
