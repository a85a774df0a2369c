// The page `serve` shows at `/`: translate typed text, see the n-best list with scores and the
// encoder–decoder attention of every head of a chosen decoder layer as heat maps. One
// self-contained HTML document (no external scripts, styles or fonts: it works offline).
#pragma once

namespace tfm {

const char* web_page_html();

}  // namespace tfm
