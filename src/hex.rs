//! Lower-case hex, for the few hot places that write it (a code's MAC, an
//! event member, a hashed subject id in a key name): pushed into a string
//! made at its size. `hex::encode` collects the digits char by char through
//! an iterator, about 1,700 instructions for a code's MAC against some 500.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The lower-case hex digits of `bytes`, two a byte.
pub(crate) fn lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_digits_are_the_hex_crates() {
        let bytes: [u8; 32] = rand::random();
        for b in [&[][..], &[0x00, 0xff, 0x0f, 0xf0, 0x9a], &bytes] {
            assert_eq!(super::lower(b), hex::encode(b));
        }
    }
}
