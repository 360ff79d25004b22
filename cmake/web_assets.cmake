# Build step (cmake -P) that embeds the web page of `puredrive serve` in the binary: the HTML files of WEB_DIR
# and a summary of the benchmark records of BENCH_DIR become byte arrays in the header OUT, so that GET / and
# GET /bench need no file and no network at run time.
#
# The summary keeps, of every record with a "puredrive-bench/N" schema (bench/results/*.json and
# bench/results/*/*.json), what /bench plots: the run it belongs to, date, commit, weight format, device, and per
# cell the context, decode tok/s, the floor, prefill tok/s and how the context was filled. It replaces the
# placeholder /*@BENCH_DATA@*/null in bench.html.
#
# Usage: cmake -DWEB_DIR=... -DBENCH_DIR=... -DOUT=.../web_assets.h -P web_assets.cmake
cmake_minimum_required(VERSION 3.25)
foreach(var WEB_DIR BENCH_DIR OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "web_assets.cmake: -D${var}=... is required")
  endif()
  # Relative to the working directory (file(GLOB RELATIVE) needs an absolute base).
  get_filename_component(${var} "${${var}}" ABSOLUTE)
endforeach()

# A JSON string literal of `text`. '<' is escaped too, so that the data cannot close the <script> it sits in.
function(json_quote out text)
  string(REPLACE "\\" "\\\\" text "${text}")
  string(REPLACE "\"" "\\\"" text "${text}")
  string(REPLACE "\n" "\\n" text "${text}")
  string(REPLACE "\r" "\\r" text "${text}")
  string(REPLACE "\t" "\\t" text "${text}")
  string(REPLACE "<" "\\u003c" text "${text}")
  set(${out} "\"${text}\"" PARENT_SCOPE)
endfunction()

# A member of `json` as JSON text: strings quoted, numbers as they are, null (or absent) as null.
function(json_member out json)
  string(JSON type ERROR_VARIABLE err TYPE "${json}" ${ARGN})
  if(err OR type STREQUAL "NULL")
    set(${out} "null" PARENT_SCOPE)
    return()
  endif()
  string(JSON value GET "${json}" ${ARGN})
  if(type STREQUAL "STRING")
    json_quote(value "${value}")
  elseif(NOT type STREQUAL "NUMBER")
    message(FATAL_ERROR "web_assets.cmake: ${ARGN} is a ${type}, expected a string or a number")
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

# The run a record belongs to: its directory for a run's folder (2026-12-01-h200-d307553/bench_cand_q8_1.json),
# else the file name without the weight format (2026-12-01-h200-decode-q8.json -> 2026-12-01-h200-decode).
function(record_run out rel quant)
  get_filename_component(dir "${rel}" DIRECTORY)
  if(dir)
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    get_filename_component(stem "${rel}" NAME_WE)
    string(REGEX REPLACE "-${quant}$" "" stem "${stem}")
    set(${out} "${stem}" PARENT_SCOPE)
  endif()
endfunction()

file(GLOB records RELATIVE "${BENCH_DIR}" "${BENCH_DIR}/*.json" "${BENCH_DIR}/*/*.json")
list(SORT records)
set(entries "")
foreach(rel IN LISTS records)
  file(READ "${BENCH_DIR}/${rel}" json)
  string(JSON schema ERROR_VARIABLE err GET "${json}" schema)
  if(err)
    # Not a JSON object with a schema (or not JSON at all): not a benchmark record.
    continue()
  endif()
  if(NOT schema MATCHES "^puredrive-bench/[0-9]+$")
    continue()
  endif()
  # Only decode benchmarks (`bench --synth`) are plotted: records with cells of one weight format. The
  # others (`bench --model`, the API bench, the upload reader) share the schema but not that shape.
  string(JSON quant ERROR_VARIABLE err GET "${json}" model quant)
  if(err)
    continue()
  endif()
  string(JSON cells_type ERROR_VARIABLE err TYPE "${json}" cells)
  if(err OR NOT cells_type STREQUAL "ARRAY")
    continue()
  endif()
  record_run(run "${rel}" "${quant}")
  json_quote(run_json "${run}")
  json_quote(file_json "${rel}")
  json_quote(quant_json "${quant}")
  json_member(date "${json}" date_utc)
  json_member(commit "${json}" commit)
  json_member(note "${json}" note)
  json_member(synth "${json}" model synth)
  json_member(device "${json}" device name)
  json_member(mode "${json}" protocol mode)
  # Built with string(APPEND), not lists: JSON text may hold ';' and '[', which CMake lists treat specially.
  string(JSON ncells LENGTH "${json}" cells)
  set(cells "")
  if(ncells GREATER 0)
    math(EXPR last "${ncells} - 1")
    foreach(i RANGE ${last})
      set(cell "")
      foreach(field context decode_tokens_per_second floor_tokens_per_second prefill_tokens_per_second fill)
        json_member(value "${json}" cells ${i} ${field})
        if(cell STREQUAL "")
          set(cell "${value}")
        else()
          string(APPEND cell ",${value}")
        endif()
      endforeach()
      if(NOT cells STREQUAL "")
        string(APPEND cells ",")
      endif()
      string(APPEND cells "[${cell}]")
    endforeach()
  endif()
  if(NOT entries STREQUAL "")
    string(APPEND entries ",\n")
  endif()
  string(APPEND entries "{\"run\":${run_json},\"file\":${file_json},\"schema\":\"${schema}\",\"date\":${date},\
\"commit\":${commit},\"note\":${note},\"quant\":${quant_json},\"model\":${synth},\"device\":${device},\
\"mode\":${mode},\"cells\":[${cells}]}")
endforeach()
set(bench_data "{\"cell_fields\":[\"context\",\"decode_tokens_per_second\",\"floor_tokens_per_second\",\
\"prefill_tokens_per_second\",\"fill\"],\"records\":[\n${entries}]}")

# One byte array per page; the pages are ASCII or UTF-8 text, served as they are.
function(byte_array out name text)
  string(HEX "${text}" hex)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  # Lines of 32 bytes keep the header readable by tools that dislike long lines (CMake regexes have no {n}).
  string(REPEAT "0x[0-9a-f][0-9a-f]," 32 line)
  string(REGEX REPLACE "(${line})" "\\1\n" hex "${hex}")
  set(${out} "inline constexpr unsigned char ${name}[] = {\n${hex}};\n" PARENT_SCOPE)
endfunction()

file(READ "${WEB_DIR}/index.html" index_html)
file(READ "${WEB_DIR}/bench.html" bench_html)
string(FIND "${bench_html}" "/*@BENCH_DATA@*/null" at)
if(at LESS 0)
  message(FATAL_ERROR "web_assets.cmake: ${WEB_DIR}/bench.html lacks the placeholder /*@BENCH_DATA@*/null")
endif()
string(REPLACE "/*@BENCH_DATA@*/null" "${bench_data}" bench_html "${bench_html}")
byte_array(index_array kIndexHtml "${index_html}")
byte_array(bench_array kBenchHtml "${bench_html}")

set(header "// Generated by cmake/web_assets.cmake from src/puredrive/server/web/ and bench/results/: do not edit.
#pragma once

namespace pd::server::web_assets {

${index_array}
${bench_array}
}  // namespace pd::server::web_assets
")
file(WRITE "${OUT}" "${header}")
