//! Durations as a person reads them in an error message: `1 year`, `30 s`, `1.5 ms`.

use std::fmt;
use std::time::Duration;

/// Shows a [`Duration`] in the largest unit it fills, with at most three decimals.
pub(crate) struct Human(pub(crate) Duration);

const UNITS: [(&str, &str, u128); 8] = [
    (" year", " years", 365 * 86_400 * 1_000_000_000),
    (" day", " days", 86_400 * 1_000_000_000),
    (" h", " h", 3_600 * 1_000_000_000),
    (" min", " min", 60 * 1_000_000_000),
    (" s", " s", 1_000_000_000),
    (" ms", " ms", 1_000_000),
    (" µs", " µs", 1_000),
    (" ns", " ns", 1),
];

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0 s");
        }
        let (one, many, size) = UNITS
            .iter()
            .copied()
            .find(|(_, _, size)| nanos >= *size)
            .unwrap_or(UNITS[UNITS.len() - 1]);
        let whole = nanos / size;
        // Three decimals, rounded down, without trailing zeros.
        let thousandths = (nanos % size) * 1000 / size;
        let unit = if whole == 1 && thousandths == 0 {
            one
        } else {
            many
        };
        match thousandths {
            0 => write!(f, "{whole}{unit}"),
            t => {
                let decimals = format!("{t:03}");
                write!(f, "{whole}.{}{unit}", decimals.trim_end_matches('0'))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Human;
    use std::time::Duration;

    #[test]
    fn durations_read_as_a_person_writes_them() {
        let cases = [
            (Duration::ZERO, "0 s"),
            (Duration::from_nanos(1), "1 ns"),
            (Duration::from_micros(1500), "1.5 ms"),
            (Duration::from_millis(1), "1 ms"),
            (Duration::from_secs(30), "30 s"),
            (Duration::from_secs(90), "1.5 min"),
            (Duration::from_secs(3 * 3600), "3 h"),
            (Duration::from_secs(86_400), "1 day"),
            (Duration::from_secs(31_536_000), "1 year"),
            (Duration::from_secs(63_072_000), "2 years"),
        ];
        for (d, text) in cases {
            assert_eq!(Human(d).to_string(), text, "{d:?}");
        }
    }
}
