//! "Did you mean …?": the closest known name to a misspelt one.

/// Edit distance counting insertions, deletions, substitutions and swaps of two neighbouring
/// characters (optimal string alignment), the measure typing mistakes are best described by.
pub(super) fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j] = distance between a[..i] and b[..j]
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// The candidate closest to `word`, if it is close enough to be a plausible typo: at most one
/// edit per three characters (at least one). Ties go to the earlier candidate.
pub(super) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (distance(word, candidate), candidate))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        let table = [
            ("", "", 0),
            ("abc", "", 3),
            ("shedule", "schedule", 1),
            ("scheduel", "schedule", 1),
            ("kitten", "sitting", 3),
            ("Europe/Berln", "Europe/Berlin", 1),
        ];
        for (a, b, want) in table {
            assert_eq!(distance(a, b), want, "{a:?} vs {b:?}");
            assert_eq!(distance(b, a), want, "{b:?} vs {a:?}");
        }
    }

    #[test]
    fn closest_picks_a_near_candidate_or_none() {
        let fields = ["name", "group", "schedule", "every", "timezone"];
        assert_eq!(closest("shedule", fields), Some("schedule"));
        assert_eq!(closest("time_zone", fields), Some("timezone"));
        assert_eq!(closest("grp", fields), None);
        assert_eq!(closest("colour", fields), None);
    }
}
