"""The µP/CompleteP GPT trainer whose loss curves collapse at fixed τ, TPP and schedule."""
