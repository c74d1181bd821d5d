// Small fixes to the theme's behaviour, shipped by book/_ext/course_html.py.
"use strict";

// 1. The sidebar buttons. pydata-sphinx-theme 0.17 draws a second, hidden copy of the
//    ☰ (.primary-toggle) and contents (.secondary-toggle) buttons in its top bar, and it
//    and sphinx-book-theme 1.3 attach their click handlers to the first copy in the page
//    only (document.querySelector). The copy a reader sees, in the article header, then
//    does nothing. We forward a click on any other copy to the first one, which opens the
//    drawer on a narrow screen and collapses the sidebar on a wide one, as the themes mean.
//    When the themes bind every copy themselves, this forwarding must go (the browser test
//    at 1,400 px then sees ☰ toggle twice, that is not at all, and fails).
function courseForwardSidebarToggles() {
  [".primary-toggle", ".secondary-toggle"].forEach((selector) => {
    const buttons = document.querySelectorAll(selector);
    const bound = buttons[0];
    buttons.forEach((button) => {
      if (button === bound) return;
      button.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopPropagation();
        button.blur(); // and with it the "Toggle ... sidebar" tooltip
        bound.click();
      });
    });
  });
}

// 2. A figure can be opened on its own, full size (a phone's pinch-zoom on the page
//    stops at the column). Sphinx already links images it scales to their file; any
//    output image that is not yet inside a link gets one.
function courseLinkOutputImages() {
  document.querySelectorAll(".cell_output img").forEach((img) => {
    if (img.closest("a")) return;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "reference internal image-reference";
    img.replaceWith(link);
    link.appendChild(img);
  });
}

if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", courseForwardSidebarToggles);
  document.addEventListener("DOMContentLoaded", courseLinkOutputImages);
} else {
  courseForwardSidebarToggles();
  courseLinkOutputImages();
}
