// Why a generation ended. decode/'s Generator and server/'s engine port report it alike, and neither depends
// on the other, so it lives here.
#pragma once

namespace pd {

// kError is the server's (an engine that failed); decode/ returns its errors as a Status instead.
enum class FinishReason { kStop, kLength, kContextFull, kCancelled, kError };

// "stop", "length", "context_full", "cancelled", "error": log lines and metric labels.
const char* finish_reason_name(FinishReason reason);

}  // namespace pd
