"""Score: every clip's pair scored by the trained model (or the MIL-NCE checkpoint), into
``scores/<model>`` rows.

- stage.py: the stage: a partition stage that a build runs as a pass of its own once train
  is done

What the report shows of the score tables is pipeline/report/scores.py.
"""
