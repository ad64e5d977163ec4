// The renderer on single constructs: each row's expected text is what
// jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, transformers' tojson) printed for the same template and
// variables.
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace serval {
namespace {

struct Case {
  const char* source;
  const char* variables;
  const char* expected;
};

const Case kCases[] = {
    {R"({{ 1.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 123.456 }} {{ -2.5e-7 }} {{ 1/3 }})",
     R"({})",
     R"(1.0 1e+16 1000000000000000.0 0.0001 1e-05 123.456 -2.5e-07 0.3333333333333333)"},
    {R"({{ [1, 'a', "it's", {'k': none}, true, 1.5] }})",
     R"({})",
     R"([1, 'a', "it's", {'k': None}, True, 1.5])"},
    {R"({{ 'a' ~ 1 ~ none ~ true }})",
     R"({})",
     R"(a1NoneTrue)"},
    {R"({{ x.y }}|{{ x['y'] }}|{{ x.items()|list }})",
     R"({"x": {"y": 2}})",
     R"(2|2|[('y', 2)])"},
    {R"({% for a, b in d.items() %}{{ a }}={{ b }};{% endfor %})",
     R"({"d": {"z": 1, "a": 2}})",
     R"(z=1;a=2;)"},
    {R"({% for x in [] %}x{% else %}empty{% endfor %})",
     R"({})",
     R"(empty)"},
    {R"({% for x in [1,2,3,4] if x is odd %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %})",
     R"({})",
     R"(1/2:1 2/2:3 )"},
    {R"({% for x in 'abc' %}{{ loop.revindex0 }}{{ x }}{% endfor %})",
     R"({})",
     R"(2a1b0c)"},
    {R"({{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ ' a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }})",
     R"({})",
     R"(hi|hi|['a', 'b', 'c']|['a', 'b', '', 'c']|['a', 'b c']|['a b', 'c'])"},
    {R"({{ 'hello world'|title }} {{ 'hELLO'|capitalize }} {{ "they're bill's".title() }})",
     R"({})",
     R"(Hello World Hello They'Re Bill'S)"},
    {R"({{ [3,1,2]|sort }} {{ ['b','A','a']|unique|list }} {{ ['b','A','c']|sort }})",
     R"({})",
     R"([1, 2, 3] ['b', 'A'] ['A', 'b', 'c'])"},
    {R"({{ x|tojson }} {{ x|tojson(indent=2) }})",
     R"({"x": {"a": [1, 2.0, "é\"\n", null, true], "b": {}}})",
     R"({"a": [1, 2.0, "é\"\n", null, true], "b": {}} {
  "a": [
    1,
    2.0,
    "é\"\n",
    null,
    true
  ],
  "b": {}
})"},
    {R"({{ 'é'|tojson(true) }})",
     R"({})",
     R"("\u00e9")"},
    {R"({{ 10 // 3 }} {{ -10 // 3 }} {{ 10 % -3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }})",
     R"({})",
     R"(3 -4 -2 64 4 3.0 0.5)"},
    {R"({{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ none == none }} {{ 1 != 2 }})",
     R"({})",
     R"(True True True True True True)"},
    {R"({{ 'ab' in 'cabd' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }})",
     R"({})",
     R"(True True True True)"},
    {R"({{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is number }} {{ true is number }} {{ 'a' is string }} {{ {} is mapping }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ x is iterable }} {{ {} is sequence }})",
     R"({})",
     R"(False True True True True True True True False True True)"},
    {R"({{ u }}|{{ u|length }}|{{ u|default('d') }}|{{ u is none }}|{{ not u }}|{% for i in u %}x{% endfor %}|{{ u == u }})",
     R"({})",
     R"(|0|d|False|True||True)"},
    {R"({% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a * 2 %}{% endfor %}{{ ns.a }})",
     R"({})",
     R"(8)"},
    {R"({% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}{{ m('q', 'r') }})",
     R"({})",
     R"([1B][2x][qr])"},
    {R"({{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[::2] }} {{ [1,2,3,4][-2:] }} {{ [1,2,3][:-1] }} {{ 'abc'[5:] }}|{{ [1,2,3][::-2] }})",
     R"({})",
     R"(bcd fedcba ace [3, 4] [1, 2] |[3, 1])"},
    {R"({{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ [1,2]|reverse|list }}{{ 'abc'|reverse }}{{ [1,2,3]|length }}{{ {'a':1}|items|list }})",
     R"({})",
     R"(13[2, 1]cba3[('a', 1)])"},
    {R"({{ users|map(attribute='name')|join(', ') }} {{ users|selectattr('age', 'gt', 20)|map(attribute='name')|list }} {{ users|rejectattr('admin')|list|length }})",
     R"({"users": [{"name": "a", "age": 10, "admin": true}, {"name": "b", "age": 30}]})",
     R"(a, b ['b'] 1)"},
    {R"({{ '3'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int }} {{ '2.5'|float }} {{ 3|string ~ 'x' }} {{ 'A b'|lower }} {{ 'a'|upper }})",
     R"({})",
     R"(4 3 0 2.5 3x a b A)"},
    {R"({{ 'a\nb'|indent(2) }}|{{ 'a\n\nb\n'|indent(2, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }})",
     R"({})",
     R"(a
  b|  a

  b
|a
  
  b)"},
    {R"({{ 'x' if true else 'y' }}{{ 'x' if false }}{{ 1 if none else 2 }})",
     R"({})",
     R"(x2)"},
    {R"({{ true and 'a' or 'b' }} {{ 0 or '' or 'z' }} {{ not 1 }} {{ not 0 and 1 }})",
     R"({})",
     R"(a z False 1)"},
    {R"({{ "a\tb\u00e9\x41\n" }}|{{ 'it\'s' }}|{{ 'unknown \q' }})",
     R"({})",
     R"(a	béA
|it's|unknown \q)"},
    {R"({%- if true -%}
  a  
{%- endif -%}
 b)",
     R"({})",
     R"(ab)"},
    {R"(  {% if true %}
    x
  {% endif %}
  {{ 'y' }}
)",
     R"({})",
     R"(    x
  y)"},
    {R"(a {# c #} b
{# line #}
c)",
     R"({})",
     R"(a  b
c)"},
    {R"({{ [1,2,3]|sum }} {{ [1,5,3]|max }} {{ [4,2]|min }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ -3|abs }})",
     R"({})",
     R"(6 5 2 2.0 3.14 3)"},
    {R"({% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %})",
     R"({})",
     R"(02)"},
    {R"({% for i in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %})",
     R"({})",
     R"(-2;1-3;2-;)"},
    {R"({{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('bc') }}{{ 'a-b'.replace('-', '+') }}{{ 'aXbX'.lower() }}{{ 'hi'.upper() }}{{ '  s '.strip() }}{{ 'xxs'.lstrip('x') }}{{ 'sxx'.rstrip('x') }})",
     R"({})",
     R"(TrueTruea+baxbxHIsss)"},
    {R"({{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 5) }}{{ d.keys()|list }}{{ d.values()|list }})",
     R"({"d": {"a": 1}})",
     R"(1None5['a'][1])"},
    {R"({% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }})",
     R"({})",
     R"(12(1, 2))"},
    {R"({{ dict(a=1, b='x') }} {{ {'x': 1} == {'x': 1.0} }})",
     R"({})",
     R"({'a': 1, 'b': 'x'} True)"},
    {R"({{ 3 is divisibleby 3 }} {{ 'x' is equalto 'x' }} {{ 1 is sameas 1 }} {{ none is sameas none }} {{ 'abc' is lower }})",
     R"({})",
     R"(True True True True True)"},
    {R"({{ 'x' * 3 }} {{ [0] * 2 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 1 + 2.0 }})",
     R"({})",
     R"(xxx [0, 0] ab [1, 2] 3.0)"},
    {R"({{ x['missing'] }}|{{ x[0] }}|{{ l[5] }}|{{ l[-1] }})",
     R"({"x": {"a": 1}, "l": [1, 2]})",
     R"(|||2)"},
    {R"({{ m.content }})",
     R"({"m": {"role": "user"}})",
     R"()"},
    {R"({% raw %}{{ x }}{% endraw %})",
     R"({})",
     R"({{ x }})"},
};

TEST(JinjaRender, MatchesJinja2) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.source);
    ChatTemplate t(c.source);
    EXPECT_EQ(t.render(nlohmann::ordered_json::parse(c.variables)), c.expected);
  }
}

}  // namespace
}  // namespace serval
