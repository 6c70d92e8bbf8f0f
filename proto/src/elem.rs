//! Element types of a tensor: IEEE 754 binary32 (`f32`), binary16 (`f16`)
//! and bfloat16 (`bf16`), and the conversions the reduction needs.
//!
//! The contract of an f16 or bf16 allreduce (wire version 6): every
//! contribution is widened to `f32` (exact: both formats are subsets of
//! binary32), the owner of a shard accumulates it in `f32` in rank order,
//! divides once for an average, and rounds **once** to the op's type, to
//! nearest, ties to even; the all-gather carries the rounded values, so every
//! rank holds the same bytes. [`round`] is that rounding; [`encode`],
//! [`decode`] and [`decode_add`] move elements between an op's `f32` memory
//! and the little-endian wire bytes of its type.
//!
//! The conversions are written out here (a few lines each, no dependency):
//! `bf16` is the upper half of a binary32, rounded to nearest even on the
//! lower half; `f16` has 5 exponent and 10 fraction bits, with subnormals
//! below 2⁻¹⁴ and infinity from 65 520 up. A NaN stays a NaN (quiet, sign
//! and the upper payload bits kept); infinities and signed zeros are kept.
//! The tests check every `f16` and `bf16` value and every rounding midpoint.

use crate::wire::DType;

/// The `f32` value of an IEEE 754 binary16 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1F;
    let man = u32::from(h & 0x3FF);
    let bits = match exp {
        0 => {
            // Zero or subnormal: man · 2⁻²⁴, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            v.to_bits()
        }
        0x1F => 0x7F80_0000 | man << 13,
        _ => (exp + 112) << 23 | man << 13,
    };
    f32::from_bits(sign | bits)
}

/// `x` rounded to the nearest IEEE 754 binary16, ties to even (overflow to
/// infinity, underflow through the subnormals to a signed zero).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7FFF_FFFF;
    if a > 0x7F80_0000 {
        // NaN: quiet, with the upper payload bits.
        return sign | 0x7E00 | ((a >> 13) as u16 & 0x3FF);
    }
    if a == 0x7F80_0000 {
        return sign | 0x7C00;
    }
    let exp = (a >> 23) as i32 - 127;
    if exp > 15 {
        return sign | 0x7C00;
    }
    let (h, rem, half) = if exp >= -14 {
        let man = a & 0x7F_FFFF;
        (((exp + 15) as u32) << 10 | man >> 13, man & 0x1FFF, 0x1000)
    } else if exp >= -25 {
        // Subnormal (or rounds to zero or to the smallest one): units of 2⁻²⁴.
        let man = (a & 0x7F_FFFF) | 0x80_0000;
        let s = (-1 - exp) as u32;
        (man >> s, man & ((1 << s) - 1), 1 << (s - 1))
    } else {
        return sign;
    };
    // Round to nearest, ties to even; a carry moves into the exponent, up to
    // infinity, which is the right answer.
    let up = rem > half || (rem == half && h & 1 == 1);
    sign | (h + u32::from(up)) as u16
}

/// The `f32` value of a bfloat16 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to the nearest bfloat16, ties to even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) as u16 | 0x0040;
    }
    // No overflow: the largest non-NaN pattern is 0xFF80_0000.
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// `x` rounded to `dtype` (to nearest, ties to even) and widened back: the
/// one rounding of an f16 or bf16 reduction. The identity for `f32`.
pub fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::F16 => f16_to_f32(f32_to_f16(x)),
        DType::Bf16 => bf16_to_f32(f32_to_bf16(x)),
    }
}

/// Round every element of `v` to `dtype` in place ([`round`]).
pub fn round_all(dtype: DType, v: &mut [f32]) {
    match dtype {
        DType::F32 => {}
        DType::F16 => v.iter_mut().for_each(|x| *x = f16_to_f32(f32_to_f16(*x))),
        DType::Bf16 => v.iter_mut().for_each(|x| *x = bf16_to_f32(f32_to_bf16(*x))),
    }
}

/// `src` as little-endian elements of `dtype` into `dst`
/// (`src.len() * dtype.size()` bytes), each rounded to nearest even.
pub fn encode(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::F32 => {
            for (d, x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        DType::F16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
            }
        }
        DType::Bf16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
            }
        }
    }
}

/// Little-endian elements of `dtype` in `src` widened into `dst`.
pub fn decode(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        DType::Bf16 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

/// Little-endian elements of `dtype` in `src` widened and added to `dst`
/// (in `f32`).
pub fn decode_add(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d += f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        DType::Bf16 => {
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d += bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_values() {
        let cases: [(f32, u16); 13] = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3C00),
            (-2.0, 0xC000),
            (0.5, 0x3800),
            (65504.0, 0x7BFF),
            (f32::INFINITY, 0x7C00),
            (f32::NEG_INFINITY, 0xFC00),
            (6.103_515_6e-5, 0x0400),               // 2^-14, smallest normal
            (5.960_464_5e-8, 0x0001),               // 2^-24, smallest subnormal
            (1023.0 * f32::powi(2.0, -24), 0x03FF), // largest subnormal
            (-65504.0, 0xFBFF),
            (1.0009766, 0x3C01), // 1 + 2^-10
        ];
        for (x, h) in cases {
            assert_eq!(f32_to_f16(x), h, "{x:e}");
            assert_eq!(f16_to_f32(h).to_bits(), x.to_bits(), "{h:#06x}");
        }
        // Below the smallest subnormal: 2^-25 is a tie (to even: zero), a
        // little more rounds up to it.
        assert_eq!(f32_to_f16(2.980_232_2e-8), 0x0000);
        assert_eq!(f32_to_f16(f32::from_bits(0x3340_0000)), 0x0001);
        assert_eq!(f32_to_f16(1.0 / 3.0), 0x3555);
        // Overflow: 65520 is the midpoint between 65504 and the next step
        // (65536): ties to even, which is infinity; just below stays finite.
        assert_eq!(f32_to_f16(65520.0), 0x7C00);
        assert_eq!(f32_to_f16(65519.996), 0x7BFF);
        assert_eq!(f32_to_f16(1e10), 0x7C00);
        assert_eq!(f32_to_f16(-1e-10), 0x8000);
        // Ties to even: 1 + 2^-11 is between 0x3C00 and 0x3C01.
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3C00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3C02);
        // NaN stays NaN, quiet, sign kept.
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_f16(-f32::NAN) & 0xFE00, 0xFE00);
        assert!(f16_to_f32(0x7C01).is_nan());
    }

    #[test]
    fn bf16_known_values() {
        let cases: [(f32, u16); 9] = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3F80),
            (-2.5, 0xC020),
            (f32::INFINITY, 0x7F80),
            (f32::NEG_INFINITY, 0xFF80),
            (f32::MAX, 0x7F80),                    // rounds up to infinity
            (f32::from_bits(0x0001_0000), 0x0001), // a subnormal, exact
            (f32::from_bits(0x0000_8000), 0x0000), // half the smallest: tie to even
        ];
        for (x, h) in cases {
            assert_eq!(f32_to_bf16(x), h, "{x:e}");
        }
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80); // tie, to even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82); // tie, to even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81); // above the tie
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert!(bf16_to_f32(f32_to_bf16(f32::from_bits(0x7F80_0001))).is_nan());
        assert_eq!(f32_to_bf16(f32::from_bits(0xFFC1_2345)), 0xFFC1);
    }

    /// Every value of both formats round-trips, and every midpoint between
    /// two neighbours (exact in f32) rounds to the even one, with the f32
    /// just below and above it rounding down and up.
    #[test]
    fn every_value_and_every_midpoint() {
        type Pair = (fn(u16) -> f32, fn(f32) -> u16);
        let formats: [(&str, Pair, u16); 2] =
            [("f16", (f16_to_f32, f32_to_f16), 0x7C00), ("bf16", (bf16_to_f32, f32_to_bf16), 0x7F80)];
        for (name, (widen, narrow), inf) in formats {
            for h in 0..=u16::MAX {
                let x = widen(h);
                if x.is_nan() {
                    assert!(widen(narrow(x)).is_nan(), "{name} {h:#06x}");
                    continue;
                }
                assert_eq!(narrow(x), h, "{name} {h:#06x} round trip");
                // The next value up in magnitude (same sign), below infinity
                // (the overflow boundary is checked in the known values).
                if (h & 0x7FFF) + 1 >= inf {
                    continue;
                }
                let (lo, hi) = (x, widen(h + 1));
                let mid = f32::midpoint(lo, hi);
                let even = if h & 1 == 0 { h } else { h + 1 };
                assert_eq!(narrow(mid), even, "{name} midpoint above {h:#06x}");
                let below = f32::from_bits(mid.to_bits() - 1);
                let above = f32::from_bits(mid.to_bits() + 1);
                if mid != 0.0 {
                    assert_eq!(narrow(below), h, "{name} below the midpoint above {h:#06x}");
                    assert_eq!(narrow(above), h + 1, "{name} above the midpoint above {h:#06x}");
                }
            }
        }
    }

    #[test]
    fn encode_decode_and_add() {
        let v = [1.0f32, -2.5, 0.1, 65504.0];
        for dtype in DType::ALL {
            let mut bytes = vec![0u8; v.len() * dtype.size()];
            encode(dtype, &v, &mut bytes);
            let mut back = [0f32; 4];
            decode(dtype, &bytes, &mut back);
            let want: Vec<f32> = v.iter().map(|&x| round(dtype, x)).collect();
            assert_eq!(back[..], want[..], "{dtype:?}");
            let mut sum = [1.0f32; 4];
            decode_add(dtype, &bytes, &mut sum);
            let want: Vec<f32> = want.iter().map(|x| 1.0 + x).collect();
            assert_eq!(sum[..], want[..], "{dtype:?}");
            let mut r = v;
            round_all(dtype, &mut r);
            assert_eq!(r[..], back[..], "{dtype:?}");
        }
        assert_eq!(round(DType::Bf16, 0.1), f32::from_bits(0x3DCD_0000));
        assert_eq!(round(DType::F16, 0.1), f16_to_f32(0x2E66));
        assert_eq!(round(DType::F32, 0.1), 0.1);
    }
}
