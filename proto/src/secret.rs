//! A credential's text (a bearer token, a worker's registration key): defined once so that
//! every config, request and flag struct that holds one can derive `Debug` and still never
//! print it.

use std::fmt;
use std::str::FromStr;

/// A credential. `Debug` shows only that it is set; the text is read with [`Secret::expose`],
/// at the one place that must send or compare it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The credential's text, for the header or comparison that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Self(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Self(text.to_owned())
    }
}

/// For command-line flags and environment variables (clap parses through `FromStr`).
impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows_in_debug_output_even_inside_another_struct() {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Config {
            token: Option<Secret>,
        }
        let shown = format!("{:?}", Config { token: Some("s3cr3t-token-value".into()) });
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("Secret(<redacted>)"), "{shown}");
    }
}
