"""How good a model's outputs are: the metrics (`metrics`) and the scoring of a run (`run`)."""
