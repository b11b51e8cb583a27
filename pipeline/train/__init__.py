"""Training on a corpus's features, after the five papers (papers/METHODS.md): `losses` and
`metrics`; the models (`models`, built from `heads`, `wal`, `cmt`, `torabi`); `pairs` (the pair
set and its loaders), `batches` (samplers and collate), `schedule`, `loop` (training,
checkpoints), `evaluation` (test protocols, `choice` for the multiple-choice test), `run`
(the CLI and the build's train stage) and `freshness` (whether a build trains again)."""
