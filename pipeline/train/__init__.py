"""Training: the five papers' losses (`losses`) and retrieval metrics (`metrics`)."""
