//! The token counts of one answer: what the meter reads from it, and what the activity log, the
//! metrics and the performance samples keep. Plain data, below both.

/// Token counts found in a response, from OpenAI `usage` or llama.cpp `timings`, and what else
/// they tell (for the activity log).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
    /// Prompt tokens served from a cache.
    pub cache: Option<u64>,
    pub draft: Option<u64>,
    pub draft_accepted: Option<u64>,
    pub prompt_per_second: Option<f64>,
    pub tokens_per_second: Option<f64>,
}
