//! How many terminal columns text takes, so that `status` lines up names in
//! Chinese, Japanese or Korean and emoji (docs/operating.md: "Who holds a lock"): the
//! wide ranges of Unicode's East Asian Width (W and F) that are in common
//! use, and the marks that combine with the character before them.

/// The columns `text` takes on a terminal.
pub fn display_width(text: &str) -> usize {
    text.chars().map(char_width).sum()
}

fn char_width(c: char) -> usize {
    match u32::from(c) {
        // Combining marks, zero-width spaces and joiners, variation selectors.
        0x0300..=0x036F | 0x200B..=0x200F | 0x20D0..=0x20FF | 0xFE00..=0xFE0F => 0,
        0x1100..=0x115F // Hangul Jamo
        | 0x2E80..=0x303E // CJK radicals, punctuation
        | 0x3041..=0x33FF // kana, CJK symbols
        | 0x3400..=0x4DBF // CJK extension A
        | 0x4E00..=0x9FFF // CJK unified ideographs
        | 0xA000..=0xA4CF // Yi
        | 0xAC00..=0xD7A3 // Hangul syllables
        | 0xF900..=0xFAFF // CJK compatibility ideographs
        | 0xFE30..=0xFE4F // CJK compatibility forms
        | 0xFF00..=0xFF60 | 0xFFE0..=0xFFE6 // fullwidth forms
        | 0x1F300..=0x1F64F // symbols and pictographs, emoticons
        | 0x1F680..=0x1F6FF // transport and map symbols
        | 0x1F900..=0x1F9FF // supplemental symbols and pictographs
        | 0x20000..=0x3FFFD => 2, // CJK extensions B and on
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_characters_take_two_columns_and_marks_none() {
        assert_eq!(display_width("backup"), 6);
        assert_eq!(display_width("备份"), 4);
        assert_eq!(display_width("バックアップ"), 12);
        assert_eq!(display_width("백업"), 4);
        assert_eq!(display_width("🔒x"), 3);
        assert_eq!(display_width("ｂ"), 2);
        assert_eq!(display_width("e\u{301}"), 1);
        assert_eq!(display_width("é"), 1);
    }
}
