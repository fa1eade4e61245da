"""The learned components: router and length predictor on generated and real outcomes, and the live loop."""
