//! UpperCamelCase reasons the agent puts in its report and Events (besides
//! `ttdp_kmod::KmodError::reason`, used for module failures).

/// The module is held by processes and force unload is off.
pub const DEVICE_HELD: &str = "DeviceHeld";
/// The target version was loaded where no module was.
pub const MODULE_INSTALLED: &str = "ModuleInstalled";
/// The target version replaced another loaded version (upgrade or downgrade).
pub const MODULE_REPLACED: &str = "ModuleReplaced";
/// The loaded module changed (unloaded or replaced) without the agent.
pub const MODULE_CHANGED: &str = "ModuleChangedExternally";
/// Another version is loaded and the controller has not granted the node its upgrade yet.
pub const WAITING_FOR_GRANT: &str = "WaitingForGrant";
/// Holders were killed before unloading (force unload).
pub const HOLDERS_KILLED: &str = "HoldersKilled";
/// The host's DKMS state or module status could not be read.
pub const HOST_PROBE_FAILED: &str = "HostProbeFailed";
/// tt-smi was copied to the host.
pub const TT_SMI_INSTALLED: &str = "TtSmiInstalled";
/// tt-smi could not be copied to the host.
pub const TT_SMI_COPY_FAILED: &str = "TtSmiCopyFailed";
/// The target must be built and this image's compiler is not the kernel's: nothing is built.
pub const COMPILER_MISMATCH: &str = "CompilerMismatch";
/// tt-kmd's udev rule could not be put in place, or udev could not be told to reload it.
pub const UDEV_RULE_NOT_APPLIED: &str = "UdevRuleNotApplied";
/// The node is host-managed (DKMS); the agent stands down.
pub const HOST_MANAGED: &str = "HostManaged";
/// The loaded module was unloaded without a `.ko` to roll back to, because the node opted in
/// (`driver.tenstorrent.com/allow-no-rollback=true`).
pub const NO_ROLLBACK_ALLOWED: &str = "UpgradingWithoutRollback";
/// The target version is loaded (not by this agent run) but failed its post-load validation;
/// after a swap the reasons are `ttdp_kmod::KmodError::reason`'s (`ValidationFailedRolledBack`,
/// `ValidationFailed`, `ValidationFailedRollbackFailed`).
pub const VALIDATION_FAILED: &str = "ValidationFailed";
/// A validated, Ready module's devices stopped working (unbound, or their nodes gone).
pub const DEVICES_LOST: &str = "DevicesLost";
/// A swap a stopped agent left half-way was finished: its target is loaded.
pub const SWAP_RESUMED: &str = "SwapResumed";
/// A swap a stopped agent left half-way could not be finished (its target cannot be loaded, or
/// failed its validation): the version loaded before it was loaded back.
pub const SWAP_RESUMED_ROLLED_BACK: &str = "SwapResumedRolledBack";
/// A swap a stopped agent left half-way could not be settled (for a module failure the reason
/// is `ttdp_kmod::KmodError::reason`'s, `SwapResumeFailed`).
pub const SWAP_RESUME_FAILED: &str = "SwapResumeFailed";
