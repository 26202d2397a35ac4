// check_chat_template and the Jinja subset under it: the real Qwen2.5 template reproduces the 22 golden Hugging Face
// renderings and passes; templates that render the driver's prompts differently fail naming both renderings;
// constructs outside the subset fail by name; hand-checked interpreter cases (each expected string is what Jinja2
// 3.1.6 renders with Hugging Face's settings: trim_blocks, lstrip_blocks, loopcontrols, json.dumps as tojson).
#include "qwen_gsm8k/text/chat_template.hpp"

#include <fstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/text/jinja/jinja.hpp"
#include "support/files.hpp"
#include "support/qwen_fixtures.hpp"
#include "support/shared.hpp"

namespace {

using qwen::ChatMessage;
using qwen::check_chat_template;
using qwen::kChatTemplateOverrideHint;
using qwen::jinja::Json;
using qwen::jinja::Template;
using qwen::jinja::TemplateError;

// The template of Qwen2.5's tokenizer_config.json, as qwen::qwen25_chat_template() spells it.
std::string qwen25() {
  return std::string(qwen::qwen25_chat_template());
}

// A model directory holding a tokenizer_config.json with `config`'s members.
void write_config(const std::filesystem::path& dir, const Json& config) {
  dapo::test::write_file(dir / "tokenizer_config.json", config.dump(2));
}

std::string render(const std::string& source, const Json& variables = Json::object()) {
  return Template(source).render(variables);
}

Json sample_variables() {
  return Json::parse(R"({"messages": [{"role": "system", "content": " S "}, {"role": "user", "content": "U1"},
                                      {"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"}],
                         "x": {"b": 1, "a": [1, 2.5, "\u00e9\n"]}})");
}

}  // namespace

TEST_CASE("the Qwen2.5 template renders the 22 golden conversations byte for byte and passes the check") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5/tokenizer_config.json",
                                                 "fixtures/tokenizer/golden_chat.json");
  if (!shared) return;
  const auto dir = *shared / "fixtures" / "tokenizer" / "qwen2.5";
  const auto file = qwen::read_chat_template(dir);
  REQUIRE(file.has_value());
  CHECK(file->path == dir / "tokenizer_config.json");
  CHECK(file->special_tokens.at("eos_token") == "<|im_end|>");
  CHECK_FALSE(file->special_tokens.contains("bos_token"));  // null in the config: undefined in the template

  // The goldens come from Hugging Face's apply_chat_template, an implementation independent of ours.
  const Template chat_template(file->source);
  const Json golden = dapo::test::read_json(*shared / "fixtures" / "tokenizer" / "golden_chat.json");
  REQUIRE(golden.size() == 22);
  for (std::size_t i = 0; i < golden.size(); ++i) {
    CAPTURE(i);
    std::vector<ChatMessage> messages;
    for (const Json& message : golden[i].at("messages"))
      messages.push_back({message.at("role"), message.at("content")});
    const bool add_generation_prompt = golden[i].at("add_generation_prompt");
    CHECK(qwen::render_chat_template(chat_template, file->special_tokens, messages, add_generation_prompt) ==
          golden[i].at("text").get<std::string>());
  }
  CHECK_NOTHROW(check_chat_template(dir));
}

TEST_CASE("check_chat_template: where the template comes from") {
  dapo::test::ScratchDir dir;
  SUBCASE("no template at all passes") {
    CHECK_NOTHROW(check_chat_template(dir.path()));
    write_config(dir.path(), {{"eos_token", "<|im_end|>"}});
    CHECK_NOTHROW(check_chat_template(dir.path()));
  }
  SUBCASE("the list form uses the template named default") {
    write_config(dir.path(), {{"chat_template", Json::array({{{"name", "tool_use"}, {"template", "{{ oops"}},
                                                             {{"name", "default"}, {"template", qwen25()}}})}});
    CHECK_NOTHROW(check_chat_template(dir.path()));
    write_config(dir.path(), {{"chat_template", Json::array({{{"name", "tool_use"}, {"template", qwen25()}}})}});
    CHECK_THROWS_WITH_AS(check_chat_template(dir.path()),
                         doctest::Contains("tokenizer_config.json: \"chat_template\" is a list of named templates "
                                           "without one named \"default\""),
                         std::runtime_error);
  }
  SUBCASE("chat_template.jinja (transformers 5) takes priority over tokenizer_config.json") {
    write_config(dir.path(), {{"chat_template", qwen25()}});
    dapo::test::write_file(dir.path() / "chat_template.jinja", "{{ 'not ChatML' }}\n");
    CHECK_THROWS_WITH_AS(check_chat_template(dir.path()),
                         doctest::Contains("chat_template.jinja: the template renders"), std::runtime_error);
    // The file's final newline is dropped as Jinja drops it (keep_trailing_newline=False); CRLF reads as LF.
    std::string crlf = qwen25() + "\r\n";
    dapo::test::write_file(dir.path() / "chat_template.jinja", crlf);
    CHECK_NOTHROW(check_chat_template(dir.path()));
  }
  SUBCASE("a path that is not a directory is an error, not a directory without a template") {
    CHECK_THROWS_WITH_AS(check_chat_template(dir.path() / "missing"), doctest::Contains("missing: not a directory"),
                         std::runtime_error);
  }
  SUBCASE("a malformed tokenizer_config.json names the file and the byte") {
    dapo::test::write_file(dir.path() / "tokenizer_config.json", "{\"chat_template\": ");
    CHECK_THROWS_WITH_AS(check_chat_template(dir.path()),
                         doctest::Contains("tokenizer_config.json: not valid JSON at byte"), std::runtime_error);
  }
}

TEST_CASE("check_chat_template: a template that renders the driver's prompts differently fails with both renderings") {
  dapo::test::ScratchDir dir;
  SUBCASE("Llama 3 style headers") {
    write_config(dir.path(), {{"bos_token", "<|begin_of_text|>"},
                              {"chat_template",
                               "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + "
                               "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' "
                               "}}{%- endfor %}{%- if add_generation_prompt %}{{- "
                               "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"}});
    CHECK_THROWS_WITH_AS(
        check_chat_template(dir.path()),
        doctest::Contains("tokenizer_config.json: its \"chat_template\" renders the conversation \"system + user, with "
                          "the generation prompt (the driver's prompt)\" differently from the built-in ChatML "
                          "renderer, first at byte 2"),  // both begin with \"<|\"
        std::runtime_error);
    CHECK_THROWS_WITH(
        check_chat_template(dir.path()),
        doctest::Contains("  template: \"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n"));
    CHECK_THROWS_WITH(check_chat_template(dir.path()),
                      doctest::Contains("  built-in: \"<|im_start|>system\\n\\nAnswer"));
    CHECK_THROWS_WITH(check_chat_template(dir.path()), doctest::Contains(kChatTemplateOverrideHint));
  }
  SUBCASE("a ChatML template that trims the content differs where the system prompt starts") {
    std::string trimmed = qwen25();
    const std::string content = "messages[0]['content']";
    trimmed.replace(trimmed.find(content), content.size(), content + " | trim");
    write_config(dir.path(), {{"chat_template", trimmed}});
    // "<|im_start|>system\n" is 19 bytes; the built-in keeps the prompt's leading newline there.
    CHECK_THROWS_WITH(check_chat_template(dir.path()), doctest::Contains("first at byte 19 ("));
    CHECK_THROWS_WITH(check_chat_template(dir.path()),
                      doctest::Contains("  template: \"<|im_start|>system\\nAnswer in"));
    CHECK_THROWS_WITH(check_chat_template(dir.path()),
                      doctest::Contains("  built-in: \"<|im_start|>system\\n\\nAnswer in"));
  }
  SUBCASE("a generation prompt that opens a <think> block (as R1-distilled Qwen2 models do)") {
    std::string thinking = qwen25();
    const std::string prompt = "'<|im_start|>assistant\\n'";
    thinking.replace(thinking.rfind(prompt), prompt.size(), "'<|im_start|>assistant\\n<think>\\n'");
    write_config(dir.path(), {{"chat_template", thinking}});
    CHECK_THROWS_WITH(check_chat_template(dir.path()),
                      doctest::Contains("<|im_start|>assistant\\n<think>\\n\"\n  built-in: ...\""));
  }
  SUBCASE("a template that refuses the conversation with raise_exception") {
    write_config(dir.path(), {{"chat_template",
                               "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') "
                               "}}{% endif %}"}});
    CHECK_THROWS_WITH_AS(check_chat_template(dir.path()),
                         doctest::Contains("with its \"chat_template\" failed: line 1, column 41 (byte 40): "
                                           "`raise_exception('System role not supported')`: the template called "
                                           "raise_exception(\"System role not supported\")"),
                         std::runtime_error);
  }
}

TEST_CASE("check_chat_template: another default system message passes, since the driver always sends a system one") {
  // Qwen2-Instruct's layout: it injects "You are a helpful assistant." where Qwen2.5 injects "You are Qwen, ...".
  // The two differ only for a conversation without a system message, which the driver never renders.
  dapo::test::ScratchDir dir;
  write_config(dir.path(),
               {{"chat_template",
                 "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
                 "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
                 "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                 "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"}});
  CHECK_NOTHROW(check_chat_template(dir.path()));
}

TEST_CASE("check_chat_template: a construct outside the subset is named with its place and the override") {
  dapo::test::ScratchDir dir;
  SUBCASE("{% macro %}") {
    write_config(dir.path(), {{"chat_template", "{% macro turn(m) %}{{ m.content }}{% endmacro %}" + qwen25()}});
    const std::string expected =
        "tokenizer_config.json: the built-in Jinja subset cannot run its \"chat_template\": line 1, column 1 (byte 0): "
        "{% macro %} is outside the supported Jinja subset (hint: " +
        std::string(kChatTemplateOverrideHint) + ")";
    CHECK_THROWS_WITH_AS(check_chat_template(dir.path()), doctest::Contains(expected.c_str()), std::runtime_error);
  }
  SUBCASE("{% include %} on the second line of chat_template.jinja") {
    dapo::test::write_file(dir.path() / "chat_template.jinja", "{{ bos_token }}\n  {% include 'turns.jinja' %}\n");
    CHECK_THROWS_WITH(
        check_chat_template(dir.path()),
        doctest::Contains("chat_template.jinja: the built-in Jinja subset cannot run the template: line 2, "
                          "column 3 (byte 18): {% include %} is outside the supported Jinja subset"));
  }
  SUBCASE("a filter outside the subset, when the conversations reach it") {
    write_config(dir.path(), {{"chat_template", "{{ messages | map(attribute='content') | join }}"}});
    CHECK_THROWS_WITH(check_chat_template(dir.path()),
                      doctest::Contains("line 1, column 4 (byte 3): `messages | map(attribute='content')`: the filter "
                                        "'map' is outside the supported Jinja subset"));
  }
}

TEST_CASE("jinja: whitespace control as Hugging Face configures it (trim_blocks, lstrip_blocks, - and +)") {
  // lstrip_blocks removes the indentation before a block tag alone on its line, trim_blocks the newline after it.
  CHECK(render("a\n  {% if true %}\n    b\n  {% endif %}\nc") == "a\n    b\nc");
  CHECK(render("a  {%- if true -%}  b  {%- endif %}  c") == "ab  c");
  // + keeps the indentation; a comment line disappears like a block line; {{ }} tags are never stripped.
  CHECK(render("  {%+ if true %}x{% endif %}|{{ 1 }}\n{# note #}\nend") == "  x|1\nend");
  CHECK(render("{%- if true %}\n    {{- 'x' }}\n{%- endif %}") == "x");
  CHECK(render("line\r\nnext\rlast\n") == "line\nnext\nlast");  // newlines normalised, the final one dropped
}

TEST_CASE("jinja: loops, their variables and their scopes") {
  const Json variables = sample_variables();
  CHECK(render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.length }}{% if "
               "loop.first %}F{% endif %}{% if loop.last %}L{% endif %} {% endfor %}",
               variables) == "1044F 2134 3224 4314L ");
  CHECK(render("{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ "
               "loop.nextitem.role if loop.nextitem is defined else '-' }};{% endfor %}",
               variables) == "->user;system>assistant;user>user;assistant>-;");
  // A set inside a loop stays in its iteration; a namespace carries across.
  CHECK(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for m in messages %}{% set n = n + 1 %}{% set ns.n = "
               "ns.n + 1 %}{% endfor %}{{ n }} {{ ns.n }}",
               variables) == "0 4");
  CHECK(render("{% for m in messages if m.role == 'user' %}{{ m.content }}{{ loop.index }}{% else %}none{% endfor "
               "%}|{% for m in [] %}x{% else %}empty{% endfor %}",
               variables) == "U11U22|empty");
  CHECK(render("{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}{% if m.role == 'system' %}{% "
               "continue %}{% endif %}{{ m.role }}{% endfor %}",
               variables) == "user");
  CHECK(render("{% for key, value in x.items() %}{{ key }}={{ value | tojson }};{% endfor %}", variables) ==
        "b=1;a=[1, 2.5, \"\u00e9\\n\"];");
  CHECK(render("{% set greeting %}Hi {{ messages[1].content }}{% endset %}{{ greeting }}", variables) == "Hi U1");
}

TEST_CASE("jinja: filters, methods and tests") {
  const Json variables = sample_variables();
  // tojson is json.dumps(ensure_ascii=False): ", " and ": " separators, insertion order, non-ASCII kept.
  CHECK(render("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ '\u00e9\"\\\\\t\x01' | tojson }}", variables) ==
        "{\"b\": 1, \"a\": [1, 2.5, \"\u00e9\\n\"]}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5,\n    "
        "\"\u00e9\\n\"\n  ]\n}|\"\u00e9\\\"\\\\\\t\\u0001\"");
  CHECK(render("{{ 'h\u00e9llo' | length }} {{ messages | length }} {{ messages[0].content | trim }}| {{ "
               "undefined_name | default('d') }} {{ '' | default('e', true) }} {{ ['a', 1, none] | join('-') }} {{ "
               "messages | first | tojson }}",
               variables) == "5 4 S| d e a-1-None {\"role\": \"system\", \"content\": \" S \"}");
  CHECK(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'xxhixx'.strip('x') }} {{ '\\n\\n "
               "a'.lstrip('\\n') }} {{ ' a  b '.split() | tojson }} {{ 'a</think>b</think>c'.split('</think>')[-1] }} "
               "{{ 'a,b,c'.split(',', 1) | tojson }} {{ 'aXbX'.replace('X', '-') }}") ==
        "True True hi  a [\"a\", \"b\"] c [\"a\", \"b,c\"] a-b-");
  CHECK(render("{{ u is defined }} {{ none is none }} {{ 'a' is string }} {{ 1.5 is number }} {{ 1 is not string }} "
               "{{ x is mapping }} {{ 3 is odd }} {{ true is boolean }}",
               variables) == "False True True True True True True True");
  CHECK(render("{{ '\u3000 a\u00a0' | trim }}|") == "a|");  // Python's whitespace, not only ASCII
}

TEST_CASE("jinja: expressions follow Python") {
  const Json variables = sample_variables();
  CHECK(render("{{ 'a' ~ 1 ~ 2.0 ~ none ~ true }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} "
               "{{ 1e16 }} {{ 0.00001 }} {{ 0.1 + 0.2 }} {{ 1 < 2 <= 2 }} {{ 'b' in 'abc' }} {{ 'z' not in x }} {{ "
               "none or 'fallback' }} {{ 0 and 1 }} [{{ 'yes' if false }}]",
               variables) ==
        "a12.0NoneTrue 3 -4 2 1024 3.5 1e+16 1e-05 0.30000000000000004 True True True fallback 0 []");
  CHECK(render("{{ 'h\u00e9llo'[::-1] }} {{ messages[1:] | length }} {{ messages[-1].content }} {{ 'abcdef'[1:5:2] }} "
               "{{ [1, 2, 3][:-1] | tojson }}",
               variables) == "oll\u00e9h 3 U2 bd [1, 2]");
  CHECK(render(R"({{ '\u4e2d\x41\101\'"' }}|{{ "it's" }}|{{ 'a' 'b' }})") == "\u4e2dAA'\"|it's|ab");
  CHECK(render("{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- endif %}\n{%- for message "
               "in messages[1:] %}\n    {{- '<' + message.role + '>' }}\n{%- endfor %}",
               variables) == " S <user><assistant><user>");
}

TEST_CASE("jinja: tuples, dict views and iterators are not lists") {
  CHECK(render("{{ (1, 2) == [1, 2] }} {{ (1, 2) == (1, 2) }} {{ 'abc'.startswith(('x', 'a')) }} {% for k, v in {'a': "
               "1}.items() %}{{ (k, v) == ('a', 1) }} {{ (k, v) in {'a': 1}.items() }}{% endfor %} {% if []|reverse "
               "%}iterator{% endif %} {{ -2 ** 2 }} {{ {'a': 1}.keys()|list|tojson }} {{ range(3)|length }}") ==
        "False True True True True iterator 4 [\"a\"] 3");
  // Where Jinja answers from Python's own types, and the subset would not be sure to match, it refuses.
  CHECK_THROWS_WITH_AS(render("{{ 'a'.startswith(['a']) }}"), doctest::Contains("takes a string or a tuple of strings"),
                       TemplateError);
  CHECK_THROWS_WITH_AS(render("{{ (1, 2) + [3] }}"),
                       doctest::Contains("unsupported operand types for +: 'tuple' and 'list'"), TemplateError);
  CHECK_THROWS_WITH_AS(render("{{ x.items()[0] }}", {{"x", {{"a", 1}}}}),
                       doctest::Contains("subscripting a dict view or range is outside the subset"), TemplateError);
  // Jinja folds -2 into a literal and emits `-2 ** n` into Python, which reads -(2 ** n): -4 where Python gives 4.
  CHECK_THROWS_WITH_AS(render("{{ -2 ** n }}", {{"n", 2}}), doctest::Contains("renders as -(a ** b) in Jinja"),
                       TemplateError);
}

TEST_CASE("jinja: what Jinja refuses or the subset lacks throws TemplateError with the place") {
  const auto error_of = [](const std::string& source, const Json& variables = Json::object()) -> std::string {
    try {
      render(source, variables);
    } catch (const TemplateError& error) {
      return error.what();
    }
    return "(no error)";
  };
  CHECK(error_of("{{ 'a' }}\n  {{ u + 1 }}") == "line 2, column 6 (byte 15): `u + 1`: 'u' is undefined");
  CHECK(error_of("{{ x.a.b }}") == "line 1, column 4 (byte 3): `x.a`: 'x' is undefined");
  CHECK(error_of("{{ 1 + 'a' }}") ==
        "line 1, column 4 (byte 3): `1 + 'a'`: unsupported operand types for +: 'int' and 'str'");
  CHECK(error_of("{{ messages }}", sample_variables()) ==
        "line 1, column 4 (byte 3): `messages`: printing a value of type 'list' (Python's repr) is outside the subset; "
        "use "
        "the tojson filter");
  CHECK(error_of("{{ 'ab'.upper }}") ==
        "line 1, column 4 (byte 3): `'ab'.upper`: `upper` is a method of Python's str; using it without calling it "
        "is outside the subset");
  CHECK(error_of("{{ 'ab'.zfill(5) }}") ==
        "line 1, column 4 (byte 3): `'ab'.zfill(5)`: calling str.zfill() is outside the subset");
  CHECK(error_of("{{ x is sameas y }}") ==
        "line 1, column 4 (byte 3): `x is sameas y`: the test 'sameas' is outside the supported Jinja subset");
  CHECK(error_of("{% if true %}x") == "line 1, column 1 (byte 0): {% if %} is not closed: no {% endif %} follows");
  CHECK(error_of("{% raw %}{{ x }}{% endraw %}") ==
        "line 1, column 1 (byte 0): {% raw %} is outside the supported Jinja subset");
  CHECK(error_of("{{ strftime_now('%Y') }}") ==
        "line 1, column 4 (byte 3): `strftime_now('%Y')`: strftime_now() renders today's date, which is outside the "
        "subset");
  CHECK(error_of("x {{ 1 ") == "line 1, column 3 (byte 2): the tag {{ is not closed (no }} follows)");
  CHECK(error_of("{% break %}") == "line 1, column 1 (byte 0): {% break %} outside a for loop");

  try {
    Template("\n\u4e2d {% with %}");
    FAIL("no error");
  } catch (const TemplateError& error) {
    CHECK(error.line() == 2);
    CHECK(error.column() == 3);  // characters, not bytes
    CHECK(error.offset() == 5);
    CHECK(error.problem() == "{% with %} is outside the supported Jinja subset");
  }
}
