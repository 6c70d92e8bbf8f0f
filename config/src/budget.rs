//! Loss budgets as users write them: a fraction (`0.01`) or a percentage
//! string (`"1%"`), the same on every surface (the configuration's
//! `loss.budget` / `loss.gather_budget`, `dlcpd demo --budget`,
//! `dlcpd simulate --budget`; the Python client follows the same rules).
//!
//! A bare number is always a fraction: `1` is 100 %, not 1 %, and is refused
//! with a message that says so and shows both ways to write 1 %.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// Hard cap on any loss budget (`loss.budget`, `loss.gather_budget`, a
/// trainer's request): 10 %.
pub const MAX_BUDGET: f64 = 0.10;

/// How to write a budget, for error messages.
pub const BUDGET_FORMS: &str = "a budget is a fraction: write 0.01 or \"1%\" for 1%";

/// Why a budget string was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// Neither a number nor a number followed by `%`.
    #[error("invalid budget {0:?} (allowed: a fraction such as 0.01, or a percentage such as \"1%\")")]
    Syntax(String),
    /// Negative, or not a finite number.
    #[error("budget {0:?} is not a number >= 0 ({BUDGET_FORMS})")]
    Range(String),
    /// Above [`MAX_BUDGET`].
    #[error("budget {text:?} means {}, above the hard cap of 10% (allowed: 0 ..= 0.10; {BUDGET_FORMS})", percent(*.fraction))]
    OverCap {
        /// What was written.
        text: String,
        /// The fraction it means.
        fraction: f64,
    },
}

/// A fraction shown as a percentage (`0.25` → `"25%"`, `0.07` → `"7%"`), to
/// a millionth of a percent.
pub fn percent(fraction: f64) -> String {
    format!("{}%", (fraction * 100.0 * 1e6).round() / 1e6)
}

/// Parses a budget written as a fraction (`"0.01"`) or a percentage (`"1%"`,
/// `"0.5 %"`) into a fraction, without the cap check (the configuration's
/// validation applies the cap with the field's location).
pub fn parse_budget_unchecked(text: &str) -> Result<f64, BudgetError> {
    let t = text.trim();
    let (number, percent) = match t.strip_suffix('%') {
        Some(n) => (n.trim_end(), true),
        None => (t, false),
    };
    let v: f64 = number.parse().map_err(|_| BudgetError::Syntax(text.to_owned()))?;
    if !v.is_finite() || v < 0.0 {
        return Err(BudgetError::Range(text.to_owned()));
    }
    Ok(if percent { v / 100.0 } else { v })
}

/// Parses a budget (see [`parse_budget_unchecked`]) and checks it against the
/// hard cap [`MAX_BUDGET`] (10 %): what the command-line flags take.
pub fn parse_budget(text: &str) -> Result<f64, BudgetError> {
    let fraction = parse_budget_unchecked(text)?;
    if fraction > MAX_BUDGET {
        return Err(BudgetError::OverCap { text: text.trim().to_owned(), fraction });
    }
    Ok(fraction)
}

/// serde: a budget field (`loss.budget`, `loss.gather_budget`) as a TOML number
/// (a fraction) or a string (a fraction or a percentage, `"1%"`). The range
/// is checked by the validation, which knows the field's place in the file.
pub(crate) fn de_budget<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = f64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a fraction such as 0.01, or a percentage string such as \"1%\"")
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
            parse_budget_unchecked(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_and_percentages_mean_the_same() {
        assert_eq!(parse_budget("0.01"), Ok(0.01));
        assert_eq!(parse_budget("1%"), Ok(0.01));
        assert_eq!(parse_budget(" 2.5 % "), Ok(0.025));
        assert_eq!(parse_budget("0"), Ok(0.0));
        assert_eq!(parse_budget("0%"), Ok(0.0));
        assert_eq!(parse_budget("10%"), Ok(0.1));
    }

    #[test]
    fn a_bare_number_above_the_cap_says_budgets_are_fractions() {
        let e = parse_budget("1").unwrap_err();
        assert!(matches!(e, BudgetError::OverCap { .. }), "{e:?}");
        let shown = e.to_string();
        assert!(shown.contains("budget \"1\" means 100%, above the hard cap of 10%"), "{shown}");
        assert!(shown.contains("a budget is a fraction: write 0.01 or \"1%\" for 1%"), "{shown}");
        assert!(parse_budget("20%").unwrap_err().to_string().contains("means 20%, above"));
        assert!(matches!(parse_budget("-1%"), Err(BudgetError::Range(_))));
        assert!(matches!(parse_budget("nan"), Err(BudgetError::Range(_))));
        assert!(matches!(parse_budget("1 percent"), Err(BudgetError::Syntax(_))));
        assert!(matches!(parse_budget("%"), Err(BudgetError::Syntax(_))));
        assert_eq!(parse_budget_unchecked("25%"), Ok(0.25));
        assert_eq!((percent(0.07), percent(0.0), percent(0.025)), ("7%".into(), "0%".into(), "2.5%".into()));
    }
}
