//! nvhook's model, kept apart from every reader and effect: plain data that the NVML helper
//! (`nvhook-nvml`) and nvhook share without the helper depending on nvhook's whole package.
//! It holds what NVML reports about the GPUs; the rest of the model (request, plan, config)
//! is to follow it here.

pub mod inventory;
