//! Placeholder (lead): keeps the workspace manifest valid until the drain example is written.
fn main() {}
