#!/usr/bin/env python3
"""Build the tokenizer test corpus: a deterministic list of >= 3,000 strings that stress a byte-level
BPE tokenizer (source code, prose in many scripts, emoji sequences, whitespace runs, digits,
contractions, non-NFC text, special tokens and look-alikes, random Unicode).

The corpus is committed (tests/tokenizer/qwen3_reference.jsonl, written by make_reference.py), so
CI never runs this. Regenerating it reads a few Python stdlib modules and GCC's C++ headers from the
machine; different versions of those change the corpus, not its coverage.

Usage: python make_corpus.py OUT.json (make_reference.py imports build_corpus() directly)
"""
import json
import os
import random
import sys
import sysconfig
import unicodedata

SEED = 20240607

PROSE = {
    "en": "The quick brown fox jumps over the lazy dog. She said, \"It's 5 o'clock somewhere!\" "
          "Don't worry; we'll fix it by Monday, won't we?",
    "fr": "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ? Ça coûte 3,50 € "
          "l'unité, n'est-ce pas ? « Voilà », dit-il.",
    "de": "Größere Übungen fördern die Fähigkeiten; Straße, Maß und Fußgängerübergänge. "
          "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "es": "¿Dónde está la biblioteca? ¡Qué año tan extraño! El niño comió piña y jalapeños en "
          "el pingüino de cigüeña.",
    "pt": "Não há razão para pânico; a ação começou às três horas e acabou às seis e meia.",
    "pl": "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "cs": "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "vi": "Tiếng Việt có nhiều dấu thanh: à, á, ả, ã, ạ. Người ta nói rằng học, học nữa, học mãi.",
    "tr": "İstanbul'da ılık bir gün; Iğdır ve Şırnak'a gidiyoruz. Pijamalı hasta yağız şoföre "
          "çabucak güvendi.",
    "is": "Kæmi ný öxi hér, ykist þjófum nú bæði víl og ádrepa.",
    "ru": "Съешь же ещё этих мягких французских булок, да выпей чаю. В чащах юга жил бы цитрус? "
          "Да, но фальшивый экземпляр!",
    "uk": "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "sr": "Ђаче, уштеду плаћај жаљењем због џиновских цифара.",
    "el": "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.",
    "ar": "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق. "
          "العدد ١٢٣٤٥٦٧٨٩٠ مكتوب بالأرقام العربية.",
    "fa": "به نام خداوند جان و خرد، کزین برتر اندیشه برنگذرد. شمارهٔ ۱۲۳۴ فارسی است.",
    "he": "דג סקרן שט בים מאוכזב ולפתע מצא חברה. עִבְרִית עִם נִקּוּד.",
    "hi": "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान "
          "श्रीराम। संख्या १२३४५।",
    "bn": "আমি বাংলায় গান গাই। সকালের রোদ ঝলমলে, ১২৩ টাকা।",
    "ta": "யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்.",
    "te": "తెలుగు భాష దేశ భాషలందు లెస్స.",
    "th": "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน จงฝ่าฟันพัฒนาวิชาการ",
    "lo": "ຂອ້ຍກິນແກ້ວໄດ້ໂດຍທີ່ມັນບໍ່ໄດ້ເຮັດໃຫ້ຂອ້ຍເຈັບ",
    "km": "ខ្ញុំអាចញ៉ាំកញ្ចក់បាន ដោយគ្មានបញ្ហា",
    "my": "ကျွန်တော် ကျွန်မ မှန်စားနိုင်တယ်။ ၎င်းကြောင့် ထိခိုက်မှုမရှိပါ။",
    "si": "මට වීදුරු කෑමට හැකියි. එයින් මට කිසි හානියක් සිදු නොවේ.",
    "bo": "ཤེལ་སྒོ་ཟ་ནས་ང་ན་གི་མ་རེད།",
    "zh": "我能吞下玻璃而不伤身体。敏捷的棕色狐狸跳过了懒狗。今天天气很好，我们去公园散步吧！"
          "价格是１２３元，约合¥45.6。",
    "zh_tw": "臺灣的夜市文化非常豐富，鹹酥雞和珍珠奶茶都很有名。「你好」『世界』",
    "ja": "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナとひらがなと漢字を混ぜた文章です。"
          "ｶﾀｶﾅ（半角）も。",
    "ko": "다람쥐 헌 쳇바퀴에 타고파. 키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
    "ka": "სწრაფი ყავისფერი მელა ახტება ზარმაც ძაღლს.",
    "hy": "Բոլոր մարդիկ ծնվում են ազատ ու հավասար իրենց արժանապատվությամբ և իրավունքներով։",
    "am": "ሰማይ አይታረስ ንጉሥ አይከሰስ። የሰው ልጅ ሁሉ ሲወለድ ነጻና በክብርና በመብትም እኩልነት ያለው ነው።",
    "chr": "ᎠᏍᎦᏯ ᏗᏂᎳᏫᎩ ᎣᏏᏲ",
    "iu": "ᐊᓕᒍᖅ ᓂᕆᔭᕌᖓᒃᑯ ᓱᕋᙱᑦᑐᓐᓇᖅᑐᖓ",
    "runic": "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ",
    "gothic": "𐌰𐌽𐍃 𐌲𐌿𐌸 𐌹𐍃",
    "math": "∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε. ∑ᵢ₌₁ⁿ i² = n(n+1)(2n+1)/6, √2 ≈ 1.414, ∞ ≠ ℵ₀ ⊂ ℝ.",
    "symbols": "→ ← ↑ ↓ ⇄ ★ ☆ ♠ ♣ ♥ ♦ © ® ™ § ¶ † ‡ • … ‰ ′ ″ € £ ¥ ₹ ₽ ₿ ° ± × ÷ ½ ¾ ┌─┬─┐ │ ├─┼─┤ └─┴─┘",
}

EMOJI = [
    "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏳️‍⚧️", "🇫🇷", "🇯🇵", "🇺🇸", "🇺🇦", "🇧🇷", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿",
    "1️⃣", "#️⃣", "*️⃣", "❤️‍🔥", "🧑‍🤝‍🧑", "🫠", "🫨", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "😀", "😂", "🤖", "🚀", "🎉", "✅", "❌", "⚠️",
    "👩‍❤️‍💋‍👨", "🧔🏿‍♂️", "🤷🏻‍♀️", "🐈‍⬛", "☺︎", "☺️", "🙂", "🙃", "🔥", "💯",
]

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>", "<tool_response>", "</tool_response>", "<|fim_prefix|>", "<|fim_middle|>",
           "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|object_ref_start|>",
           "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
           "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]

LOOKALIKES = ["<|im_start", "|im_end|>", "<| im_start |>", "<|IM_START|>", "<|im_start|", "<im_start>",
              "<|im_end |>", "< think>", "<think >", "<Think>", "</ think>", "<tool_call", "tool_call>",
              "<|endoftext", "endoftext|>", "<||>", "<|>", "<|im_start||im_end|>", "<<|im_start|>>",
              "<|im_sta rt|>", "<|im\u200bstart|>", "＜|im_start|＞", "<|im_start|\u0338>", "<|fim_pre|>",
              "<|file_sep", "<|im_end|", "<|vision_start |>", "<thinking>", "</thinker>"]

CODE_SNIPPETS = {
    "rust": [
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
        "impl<T: Clone + Send + 'static> Pool<T> {\n    pub fn get(&self) -> Option<Arc<T>> {\n"
        "        self.items.lock().unwrap().pop().map(Arc::new)\n    }\n}\n",
        "#[derive(Debug, Clone, PartialEq, Eq)]\npub enum Token<'a> {\n    Ident(&'a str),\n    Number(i64),\n"
        "    Punct(char),\n}\n",
        "match self.state {\n    State::Idle => return Ok(()),\n    State::Busy { ref mut n } if *n > 0 => { *n -= 1; }\n"
        "    _ => unreachable!(\"bad state: {:?}\", self.state),\n}\n",
    ],
    "js": [
        "const fetchData = async (url) => {\n  const res = await fetch(url, { method: 'GET' });\n"
        "  if (!res.ok) throw new Error(`HTTP ${res.status}`);\n  return res.json();\n};\n",
        "export default function App({ items = [] }) {\n  return (\n    <ul className=\"list\">\n"
        "      {items.map((it, i) => <li key={i}>{it?.name ?? 'n/a'}</li>)}\n    </ul>\n  );\n}\n",
        "document.querySelectorAll('a[href^=\"http\"]').forEach(a => a.setAttribute('rel', 'noopener'));\n",
        "let x = 0x1F; x >>>= 2; console.log(x === 7 ? \"yes\" : 'no', [...'héllo'].length);\n",
    ],
    "go": [
        "package main\n\nimport (\n\t\"fmt\"\n\t\"strings\"\n)\n\nfunc main() {\n\tfmt.Println(strings.Repeat(\"ab\", 3))\n}\n",
        "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {\n\tdefer r.Body.Close()\n"
        "\tif err := json.NewDecoder(r.Body).Decode(&req); err != nil {\n\t\thttp.Error(w, err.Error(), 400)\n\t\treturn\n\t}\n}\n",
        "type Pair[K comparable, V any] struct {\n\tKey   K\n\tValue V\n}\n",
    ],
    "shell": [
        "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'\ndone\n",
        "find . -name '*.py' -print0 | xargs -0 grep -n 'TODO' 2>/dev/null || true\n",
        "export PATH=\"$HOME/.local/bin:$PATH\"\n[ -d build ] && rm -rf build/ && mkdir -p build && cd build && cmake .. -DCMAKE_BUILD_TYPE=Release\n",
        "if [[ $# -lt 2 ]]; then echo \"usage: $0 <in> <out>\" >&2; exit 1; fi\ncat <<'EOF' > \"$2\"\nline one\nEOF\n",
    ],
    "sql": [
        "SELECT u.id, u.name, COUNT(o.id) AS orders\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\n"
        "WHERE u.created_at >= '2024-01-01'\nGROUP BY u.id, u.name\nHAVING COUNT(o.id) > 3\nORDER BY orders DESC\nLIMIT 10;\n",
        "CREATE TABLE IF NOT EXISTS items (\n  id BIGSERIAL PRIMARY KEY,\n  name TEXT NOT NULL,\n  price NUMERIC(10, 2) DEFAULT 0.00\n);\n",
        "UPDATE accounts SET balance = balance - 100.50 WHERE id = 42 AND balance >= 100.50; -- debit\n",
    ],
    "cpp": [
        "template <typename T>\nstd::vector<T> topk(const std::vector<T>& v, size_t k) {\n  auto out = v;\n"
        "  std::partial_sort(out.begin(), out.begin() + std::min(k, out.size()), out.end(), std::greater<>());\n"
        "  out.resize(std::min(k, out.size()));\n  return out;\n}\n",
        "#include <iostream>\nint main(int argc, char** argv) {\n  std::cout << \"argc=\" << argc << '\\n';\n  return 0;\n}\n",
        "static_assert(sizeof(uint16_t) == 2, \"bf16 is 2 bytes\");\nconstexpr float kEps = 1e-6f;\n",
    ],
    "java": [
        "public final class Main {\n    public static void main(String[] args) {\n"
        "        List<String> xs = List.of(\"a\", \"b\");\n        xs.forEach(System.out::println);\n    }\n}\n",
    ],
    "html": [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test &amp; check</title></head>\n"
        "<body><p class=\"x\">Hello,&nbsp;world!</p><!-- comment --></body>\n</html>\n",
        "<div style=\"color:#ff0000;margin:0 auto\" data-id='7'>&lt;b&gt;bold&lt;/b&gt;</div>\n",
    ],
    "css": [".btn:hover > span::after {\n  content: '→';\n  transition: all .3s ease-in-out;\n  color: rgba(0,0,0,.5);\n}\n"],
    "yaml": ["version: '3.8'\nservices:\n  web:\n    image: \"nginx:1.25\"\n    ports:\n      - \"8080:80\"\n"
             "    environment:\n      - KEY=value  # comment\n"],
    "latex": ["\\begin{equation}\n  \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n"],
    "markdown": ["# Title\n\n- item **bold** and _italic_\n- `code` and [link](https://example.com/a?b=c&d=e#f)\n\n"
                 "```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"],
}

PY_MODULES = ["textwrap.py", "heapq.py", "bisect.py", "functools.py", "argparse.py", "difflib.py",
              "string.py", "shlex.py", "tokenize.py", "csv.py", "calendar.py", "colorsys.py",
              "fractions.py", "json/decoder.py", "json/encoder.py", "statistics.py", "random.py"]
CPP_HEADERS = ["/usr/include/c++/12/bits/stl_algo.h", "/usr/include/c++/12/bits/basic_string.h",
               "/usr/include/c++/12/optional", "/usr/include/c++/12/bits/shared_ptr_base.h",
               "/usr/include/c++/12/bits/unordered_map.h"]

WORDS = ("alpha beta gamma delta epsilon zeta theta lambda sigma omega value index count buffer result "
         "tensor weight layer token model cache state error retry request response").split()


def line_windows(rng, path, n, min_lines=3, max_lines=40):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines(keepends=True)
    except OSError:
        print(f"note: {path} not found, skipped", file=sys.stderr)
        return []
    out = []
    for _ in range(n):
        k = rng.randint(min_lines, max_lines)
        start = rng.randrange(0, max(1, len(lines) - k))
        out.append("".join(lines[start:start + k]))
    return out


def ident(rng):
    w = rng.choice(WORDS)
    style = rng.randrange(4)
    if style == 0:
        return w + "_" + rng.choice(WORDS)
    if style == 1:
        return w + rng.choice(WORDS).capitalize()
    if style == 2:
        return w.upper()
    return w + str(rng.randrange(100))


def code_strings(rng):
    out = []
    stdlib = sysconfig.get_paths()["stdlib"]
    for mod in PY_MODULES:
        out += line_windows(rng, os.path.join(stdlib, mod), 22)
    for hdr in CPP_HEADERS:
        out += line_windows(rng, hdr, 24)
    for lang, snippets in sorted(CODE_SNIPPETS.items()):
        for s in snippets:
            out.append(s)
            for _ in range(6):
                v = s
                for w in rng.sample(WORDS, 3):
                    v = v.replace(w, ident(rng))
                if rng.random() < 0.3:
                    v = v.replace("    ", "\t")
                if rng.random() < 0.3:
                    v = v.replace("\n", "\r\n")
                if rng.random() < 0.2:
                    v = v.rstrip("\n")
                out.append(v)
    for _ in range(60):
        obj = random_json(rng, 3)
        out.append(json.dumps(obj, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2, 4, "\t"])))
    return out


def random_json(rng, depth):
    r = rng.random()
    if depth == 0 or r < 0.3:
        return rng.choice([rng.randint(-10**6, 10**12), rng.random() * 10**rng.randint(-5, 9), True, None,
                           rng.choice(list(PROSE.values()))[:rng.randint(0, 30)], ident(rng)])
    if r < 0.65:
        return {ident(rng): random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))}
    return [random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]


def prose_strings(rng):
    out = []
    texts = list(PROSE.values())
    for t in texts:
        out.append(t)
        words = t.split(" ")
        for _ in range(12):
            k = rng.randint(1, len(words))
            start = rng.randrange(0, len(words) - k + 1)
            piece = " ".join(words[start:start + k])
            mode = rng.randrange(6)
            if mode == 0:
                piece = piece.upper()
            elif mode == 1:
                piece = piece.lower()
            elif mode == 2:
                piece = piece.title()
            elif mode == 3:
                piece = "\n".join(rng.choice(texts)[:rng.randint(5, 60)] for _ in range(3))
            out.append(piece)
    for _ in range(150):  # mixed-script paragraphs
        out.append(rng.choice(["", " ", "\n", "\n\n"]).join(rng.choice(texts)[:rng.randint(1, 120)]
                                                            for _ in range(rng.randint(2, 6))))
    return out


def emoji_strings(rng):
    out = list(EMOJI)
    for _ in range(220):
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.5:
                parts.append(rng.choice(EMOJI))
            elif r < 0.8:
                parts.append(rng.choice(WORDS))
            else:
                parts.append(rng.choice(list(PROSE.values()))[:rng.randint(1, 20)])
        out.append(rng.choice(["", " ", "  ", "\n"]).join(parts))
    # Emoji pieces cut mid-sequence (lone ZWJ, lone modifiers, lone regional indicators).
    for _ in range(40):
        e = "".join(rng.choice(EMOJI) for _ in range(3))
        a = rng.randrange(len(e))
        out.append(e[a:a + rng.randint(1, 6)] + rng.choice(["", "x", " y"]))
    return out


WS_CHARS = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u200b", "\u0085", "\u2028",
            "\x0b", "\x0c", "\u1680", "\u202f", "\ufeff"]


def whitespace_strings(rng):
    out = []
    for n in [1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 64, 100, 255, 1000]:
        for ws in [" ", "\t", "\n", "\r\n"]:
            out.append(ws * n)
            out.append("x" + ws * n + "y")
            out.append("word" + ws * n)
    out.append(" " * 10000 + "end")
    out.append("\n" * 5000)
    for _ in range(260):
        parts = []
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.5:
                parts.append("".join(rng.choice(WS_CHARS) for _ in range(rng.randint(1, 12))))
            else:
                parts.append(rng.choice([ident(rng), rng.choice(WORDS), "😀", "中文", "123", "!?", "'s"]))
        out.append("".join(parts))
    return out


DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "０１２３４５６７８９", "๐๑๒๓๔๕๖๗๘๙",
          "①②③", "ⅠⅡⅢⅣ", "½¾⅓", "²³¹⁴"]


def digit_strings(rng):
    out = []
    for _ in range(180):
        mode = rng.randrange(6)
        if mode == 0:
            out.append(str(rng.randrange(10 ** rng.randint(1, 60))))
        elif mode == 1:
            out.append(f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 12)}f}")
        elif mode == 2:
            d = rng.choice(DIGITS)
            out.append("".join(rng.choice(d) for _ in range(rng.randint(1, 30))))
        elif mode == 3:
            out.append(f"+1 ({rng.randint(200, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}, "
                       f"ID-{rng.randrange(10**8):08d}, v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}")
        elif mode == 4:
            out.append(f"{rng.randint(1, 31)}/{rng.randint(1, 12)}/{rng.randint(1900, 2100)} "
                       f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} 1e{rng.randint(-30, 30)} 0x{rng.randrange(2**32):X}")
        else:
            out.append(ident(rng) + str(rng.randrange(10**6)) + rng.choice(["px", "%", "ms", "GB", "₹", "€"]))
    out.append("9" * 5000)
    return out


CONTRACTION_BASES = ["it", "don", "we", "they", "I", "you", "she", "can", "won", "isn", "he", "that"]
CONTRACTION_TAILS = ["s", "t", "re", "ve", "m", "ll", "d"]


def contraction_strings(rng):
    out = []
    for _ in range(170):
        parts = []
        for _ in range(rng.randint(1, 6)):
            tail = rng.choice(CONTRACTION_TAILS)
            tail = "".join(c.upper() if rng.random() < 0.5 else c for c in tail)
            apos = rng.choice(["'", "'", "'", "’", "ʼ"])
            if rng.random() < 0.1:
                tail = tail.replace("s", "ſ")
            follow = rng.choice(["", "", "a", "x", "s", "'", " ", "."])
            parts.append(rng.choice(CONTRACTION_BASES) + apos + tail + follow)
        out.append(" ".join(parts))
    out += ["'s", "'S", "'t", "'LL", "'lL", "'Re", "'VE", "'ſ", "x'ſa", "''s", "'''", "I'm'm", "y'all'd've"]
    return out


COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0303", "\u030a", "\u0323", "\u0338", "\u20dd",
             "\u0653", "\u05b4", "\u093c", "\u0e49", "\u3099"]


def normalization_strings(rng):
    out = []
    nfc_sources = [PROSE["fr"], PROSE["vi"], PROSE["ko"], PROSE["de"], PROSE["ja"], PROSE["he"], PROSE["el"]]
    for t in nfc_sources:
        for form in ["NFD", "NFKD", "NFKC"]:
            out.append(unicodedata.normalize(form, t))
    for _ in range(130):
        base = rng.choice("aeiouAEIOUnNcCsSzZ가한ㄱアカ")
        s = base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 4)))
        out.append(rng.choice(WORDS) + s + rng.choice(["", " ", "x", s]))
    # Hangul conjoining jamo, compatibility characters, ligatures, full-width forms.
    out += ["\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af", "ﬁﬂﬀﬃ", "Ａｂｃ１２３！", "㍿㌀", "ℌℍℕ",
            "Å Å Å", "Ω Ω", "\u212b\u2126", "e\u0301\u0301", "\u0301leading mark", "q\u0307\u0323"]
    return out


def special_token_strings(rng):
    out = []
    for s in SPECIAL:
        out += [s, s + s, " " + s + " ", "\n" + s + "\n", "a" + s + "b", s.upper()]
    roles = ["system", "user", "assistant", "tool"]
    for _ in range(260):
        conv = []
        for _ in range(rng.randint(1, 4)):
            role = rng.choice(roles)
            body = rng.choice(list(PROSE.values()))[:rng.randint(0, 80)]
            if role == "assistant" and rng.random() < 0.6:
                body = f"<think>\n{rng.choice(list(PROSE.values()))[:40]}\n</think>\n\n" + body
            if role == "assistant" and rng.random() < 0.3:
                body += ('\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
                         + rng.choice(["Paris", "東京", "Zürich"]) + '"}}\n</tool_call>')
            if role == "tool":
                body = f"<tool_response>\n{body}\n</tool_response>"
            conv.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
        s = "".join(conv)
        if rng.random() < 0.3:
            s += "<|im_start|>assistant\n"
        if rng.random() < 0.2:
            s = rng.choice(SPECIAL) + s + rng.choice(SPECIAL)
        out.append(s)
    for _ in range(40):
        out.append("<|fim_prefix|>" + rng.choice(CODE_SNIPPETS["rust"]) + "<|fim_suffix|>" +
                   rng.choice(CODE_SNIPPETS["go"]) + "<|fim_middle|>")
    return out


def lookalike_strings(rng):
    out = list(LOOKALIKES)
    for _ in range(180):
        parts = [rng.choice(LOOKALIKES + SPECIAL + WORDS + [" ", "\n", "|", "<", ">", "<|", "|>"])
                 for _ in range(rng.randint(2, 7))]
        out.append("".join(parts))
    return out


def random_code_point(rng):
    r = rng.random()
    if r < 0.35:
        return rng.randint(0x20, 0x2FF)
    if r < 0.75:
        cp = rng.randint(0, 0xFFFF)
    else:
        cp = rng.randint(0x10000, 0x10FFFF) if rng.random() < 0.3 else rng.randint(0x10000, 0x3FFFF)
    if 0xD800 <= cp <= 0xDFFF:
        cp = 0xFFFD
    return cp


def random_unicode_strings(rng):
    out = []
    for _ in range(320):
        out.append("".join(chr(random_code_point(rng)) for _ in range(rng.randint(1, 60))))
    # Characters assigned after Unicode 14 (Unicode 15/16 letters, digits, marks).
    newer = [0x105C0, 0x1E4D0, 0x1E4F0, 0x11F04, 0x31350, 0x2EBF0, 0x1E5D0, 0x1C89, 0x0CF3, 0x1171E, 0x16D40,
             0x10D40, 0x1D2C0, 0x0897, 0x11B00]
    for _ in range(40):
        out.append("".join(rng.choice([chr(rng.choice(newer)), "a", " ", "1", "é"]) for _ in range(rng.randint(1, 12))))
    # Where the newer categories change the pre-tokenizer split: runs of Unicode 15/16 digits (each one
    # its own \p{N} piece) and letters next to spaces, digits and punctuation.
    out += ["\U0001E4F0\U0001E4F1\U0001E4F2", "x\U0001E4F3\U0001E4F4\U0001E4F5y 12", "\U00010D40\U00010D41\U00010D49",
            "\U0001D2C0\U0001D2C1\U0001D2C2", " \U000105C0\U000105C1. \U0001E4D0x", "\U00031350\U00031351abc",
            "(\U0001E5D0\U0001E5D1) 'll \U0001E4D0'S", "1\U0001E4F0\U0001E4F1\U0001E4F22"]
    out += ["\x00", "a\x00b", "\x01\x02\x03\x7f", "".join(chr(c) for c in range(0x20)), "\ufffd", "\uffff\ufffe",
            "\U0010ffff", "\U000e0001\U000e0041", "".join(chr(c) for c in range(0x80, 0x100))]
    return out


def misc_strings(rng):
    out = ["", " ", "a", "A", "\n", "'", "\"", "\\", "Ġ", "Ċ", "ĠĠ", "âĢĻ", "ð", "\u0100\u0120",
           "".join(chr(c) for c in range(0x20, 0x7f)),
           "https://example.com/path/to/page?query=1&lang=en#frag", "mailto:someone@example.org",
           "C:\\Users\\name\\file.txt", "/usr/local/bin/python3.11", "user@host:~$ ls -la | grep foo",
           "<b>bold</b> &amp; <i>it</i>", "[1, 2, 3]", "{\"a\": [1, {\"b\": null}]}", "a" * 3000,
           "ab" * 1500, "Hello" * 400]
    return out


def build_corpus():
    rng = random.Random(SEED)
    groups = [code_strings, prose_strings, emoji_strings, whitespace_strings, digit_strings,
              contraction_strings, normalization_strings, special_token_strings, lookalike_strings,
              random_unicode_strings, misc_strings]
    corpus = []
    for g in groups:
        items = g(rng)
        print(f"{g.__name__}: {len(items)}", file=sys.stderr)
        corpus += items
    assert len(corpus) >= 3000, len(corpus)
    print(f"{len(corpus)} strings, {sum(len(s.encode()) for s in corpus)} bytes", file=sys.stderr)
    return corpus


def main():
    corpus = build_corpus()
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(corpus, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
