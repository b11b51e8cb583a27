"""Models and their caches: where a published model lives, how it is fetched, and the device
it runs on. The models themselves are with their users (pipeline/features/, the ASR engines in
pipeline/transcribe/asr/, pipeline/train/).

- cache.py: the caches of published models, downloaded into on first use, and their checks
- hub.py: models from the Hugging Face hub, through the same cache
- fetch.py: ``vlcorpus fetch-models``: every model a config needs, fetched ahead of a build
- device.py: which device a stage runs on: the answer to "auto", and no GPU that is not there
"""
