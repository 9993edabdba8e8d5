"""Gymnasium environments in which a policy learns to plan (the reward is the learned cost model).
Built by the policy issue; nothing lives here yet."""
