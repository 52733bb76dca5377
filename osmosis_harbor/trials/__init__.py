"""Harbor trials read back: what a ``TrialResult`` says (``reading``), validation's verdict
rules (``verdict``), kept trials as a Harbor job (``job``) and trial names (``naming``)."""
