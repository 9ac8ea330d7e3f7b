//! Capped exponential backoff for reconnects and database retries (pure).

use std::time::Duration;

/// Delay before retry number `retry` (0-based): `initial · 2^retry`, capped at `max`.
pub fn delay(retry: u32, initial: Duration, max: Duration) -> Duration {
    let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_initial_up_to_the_cap() {
        let ms = Duration::from_millis;
        let table = [
            (0, 100),
            (1, 200),
            (2, 400),
            (5, 3_200),
            (6, 5_000),
            (40, 5_000),
        ];
        for (retry, want) in table {
            assert_eq!(delay(retry, ms(100), ms(5_000)), ms(want), "retry {retry}");
        }
    }
}
