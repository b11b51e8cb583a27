"""Training on a corpus's features, after the five papers (papers/METHODS.md): `losses` and
`metrics`; the models (`models`, built from `heads`, `wal`, `cmt`, `torabi`); `data` (pairs and
batches), `schedule`, `loop` (training, checkpoints), `evaluation` (test protocols, `choice`
for the multiple-choice test) and `run` (the CLI and the build's train stage)."""
