# Writes the PTX that nvcc made (-DPTX=...) into a C++ source (-DOUT=...) as one string constant
# (-DSYMBOL=...), run at build time by the rule in CMakeLists.txt.
file(READ "${PTX}" text)
file(WRITE "${OUT}.tmp" "// Generated from ${PTX} at build time: do not edit.\n"
  "namespace ferry::detail {\nextern const char ${SYMBOL}[];\n"
  "const char ${SYMBOL}[] = R\"ferryptx(${text})ferryptx\";\n}  // namespace ferry::detail\n")
file(RENAME "${OUT}.tmp" "${OUT}")
