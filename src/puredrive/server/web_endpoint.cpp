// GET / and GET /bench: the built-in web page (src/puredrive/server/web/, embedded at build time by
// cmake/web_assets.cmake), and GET /v1/puredrive/info, the server facts that the page shows.
//
// The pages hold no secret and reach nothing but this server: their Content-Security-Policy lets them run
// their own inline script and style and talk to their own origin only, so a page cannot load anything from
// the network even by mistake. They are open like /health; the API they call checks --api-key as always.
#include <string>

#include "puredrive/server/api_service.h"
#include "puredrive/server/web_assets.h"

namespace pd::server {
namespace {

template <size_t N>
std::string page_text(const unsigned char (&bytes)[N]) {
  return std::string(reinterpret_cast<const char*>(bytes), N);
}

}  // namespace

Reply ApiService::web_page(std::string_view path) const {
  Reply r;
  r.content_type = "text/html; charset=utf-8";
  r.body = path == "/bench" ? page_text(web_assets::kBenchHtml) : page_text(web_assets::kIndexHtml);
  r.headers = {{"Cache-Control", "no-cache"},
               {"Content-Security-Policy",
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
               {"X-Content-Type-Options", "nosniff"},
               {"Referrer-Policy", "no-referrer"}};
  return r;
}

Reply ApiService::server_info() const {
  Reply r;
  r.body = dump_json(Json{{"object", "puredrive.info"},
                          {"model", options_.model_names[0]},
                          {"backend", engine_.backend},
                          {"context_size", engine_.context_size},
                          {"vocab_size", engine_.vocab_size},
                          {"mtp_draft", engine_.mtp_draft},
                          {"system_fingerprint", fingerprint_}});
  return r;
}

}  // namespace pd::server
