"""The benchmark's published release (figshare DOI 10.6084/m9.figshare.28244480) by name.

    layout.py    the release's folders and files, as the reference code writes them;
                 the catalogue of its 11 books and their Tulving names
    tables.py    its parquet tables (pyarrow: the optional `release` extra)
    books.py     a released book -> a Tulving book folder
    check.py     imported books against the packaged ones and against df_qa
    runs.py      the paper's answers and judgments -> Tulving run folders
    importer.py  a release zip or folder -> the user's data folder, atomically
    fetch.py     the download: resumable, size- and SHA-256-checked

The command line is engine/cli/data.py (`tulving data fetch|import`, `tulving books`).
"""
