"""The paper's objects, pure Python and numpy: label schemes, prompts, records, calibration
(Eqs. 1-7), methods (Eqs. 8-14 and the baselines), metrics (§5.2)."""
