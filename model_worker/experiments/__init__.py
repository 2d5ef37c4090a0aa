"""Dataset experiments of the paper (accuracy, head location, MRR, attention, variants,
ablation, bias reduction): batched forward passes over many prompts → ExperimentResult.
A method: imports the other methods, model/, datasets/ and analysis/; never service/."""
